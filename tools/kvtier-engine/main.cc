// kvtier-engine: a minimal engine (tools/kvtier-engine/engine.h) with a real paged KV cache
// that serves one prompt three ways and prints the time to first token (TTFT) of each:
//
//   (a) recompute: prefill every prompt token.
//   (b) load, then compute: load the cached prefix from kvtierd with LayerwiseLoader, wait
//       for every layer, then compute the new tokens.
//   (c) layerwise: queue every layer's load, and before each layer's attention make the
//       compute stream wait for that layer only (WaitLayer), so layer i+1 loads while
//       layer i computes.
//
// The prefix KV is real: a prefill computes it and LayerwiseStorer stores it into kvtierd
// layer by layer (a fresh cache_salt per run, so nothing from an earlier run is reused);
// every load goes into a cleared cache and is compared bit for bit with what was stored.
// Baselines measured in the same run: load-only and compute-only times (overlap ratio of
// (c) = wall / max(load, compute)), and a plain GEMM run of exactly the recompute's GEMM
// shapes (recompute TFLOP/s / plain GEMM TFLOP/s).
//
// Exit status: 0 on success; 1 on any error, a load that delivered less than the cached
// prefix, or loaded KV that differs from the stored KV; 2 for bad flags.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine.h"
#include "kvtier/client.h"
#include "kvtier/gpu/runtime.h"
#include "kvtier/layerwise.h"
#include "model_shape.h"

namespace {

using Clock = std::chrono::steady_clock;
using kvtier::Status;
using kvtier::engine::Engine;
using kvtier::engine::PagedCache;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "kvtier-engine: %s\n", what.c_str());
  std::exit(1);
}

void Check(const Status& s, const std::string& what) {
  if (!s.ok()) Die(what + ": " + s.ToString());
}

void CheckGpu(const kvtier::gpu::GpuStatus& s, const std::string& what) {
  if (!s.ok()) Die(what + ": " + s.ToString());
}

template <typename T>
T Must(kvtier::Result<T> r, const std::string& what) {
  if (!r.ok()) Die(what + ": " + r.status().ToString());
  return std::move(r).value();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Deterministic prompt tokens in [0, 128000) (a Llama 3 sized vocabulary).
std::vector<int32_t> MakePrompt(int64_t n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  uint64_t x = 0x2545F4914F6CDD1Dull;
  for (auto& v : t) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;  // xorshift64
    v = static_cast<int32_t>(x % 128000);
  }
  return t;
}

// Byte-compares K and V of positions [0, tokens) of every layer between two caches (each
// through its own block table).
struct Comparison {
  uint64_t compared_bytes = 0;
  uint64_t differing_rows = 0;  // (layer, plane, position) rows that differ
};

Comparison ComparePrefix(kvtier::gpu::Runtime& rt, kvtier::gpu::Stream& stream,
                         const PagedCache& a, const PagedCache& b, int64_t tokens) {
  Comparison c;
  const size_t bytes = a.layout.tensor_span_bytes(0);
  std::vector<unsigned char> ha(bytes), hb(bytes);
  const auto row = static_cast<size_t>(a.token_row_bytes());
  for (size_t l = 0; l < a.layers.size(); ++l) {
    CheckGpu(rt.CopyAsync(ha.data(), a.layers[l].data(), bytes, stream), "reading cache A");
    CheckGpu(rt.CopyAsync(hb.data(), b.layers[l].data(), bytes, stream), "reading cache B");
    CheckGpu(rt.Synchronize(stream), "reading caches");
    for (int plane = 0; plane < 2; ++plane) {
      for (int64_t pos = 0; pos < tokens; ++pos) {
        if (std::memcmp(ha.data() + a.RowOffsetBytes(plane, pos),
                        hb.data() + b.RowOffsetBytes(plane, pos), row) != 0) {
          ++c.differing_rows;
        }
        c.compared_bytes += row;
      }
    }
  }
  return c;
}

float MaxAbsDiff(const std::vector<float>& x, const std::vector<float>& y) {
  float m = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const float d = std::fabs(x[i] - y[i]);
    if (!(d <= m)) m = d;  // NaN propagates
  }
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  std::string socket_path, backend = "cuda", model = "llama3-8b", json_path;
  int64_t prompt_tokens = 8192, cached_tokens = 6144;
  uint32_t chunk_tokens = 256;
  int iterations = 3, device = 0, deadline_ms = 10000;
  CLI::App app{"kvtier-engine: TTFT of recompute vs load-then-compute vs layerwise load, with a "
               "real paged KV cache stored into and loaded from kvtierd"};
  app.add_option("--socket", socket_path, "kvtierd socket (default: the daemon's default)");
  app.add_option("--backend", backend, "gpu runtime: cuda or host (emulation)")
      ->check(CLI::IsMember({"host", "cuda"}))
      ->capture_default_str();
  app.add_option("--device", device, "CUDA device ordinal")->capture_default_str();
  app.add_option("--model", model, "llama3-8b | tiny-engine (small shapes for host emulation)")
      ->capture_default_str();
  app.add_option("--prompt-tokens", prompt_tokens, "prompt length")->capture_default_str();
  app.add_option("--cached-tokens", cached_tokens,
                 "cached prefix: a positive multiple of --chunk-tokens, below --prompt-tokens")
      ->capture_default_str();
  app.add_option("--chunk-tokens", chunk_tokens, "kvtier chunk size (a multiple of 16)")
      ->capture_default_str();
  app.add_option("--iterations", iterations, "runs of each scenario (medians reported)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--deadline-ms", deadline_ms, "client deadline per RPC")->capture_default_str();
  app.add_option("--json", json_path, "also write the results as JSON here ('-' = stdout)");
  CLI11_PARSE(app, argc, argv);

  const kvtier::engine::ModelShape shape = Must(kvtier::engine::ModelShape::Preset(model), "model");
  auto bad_flag = [](const std::string& msg) {
    std::fprintf(stderr, "kvtier-engine: %s\n", msg.c_str());
    std::exit(2);
  };
  if (chunk_tokens == 0 || chunk_tokens % kvtier::engine::kBlockTokens != 0) {
    bad_flag("--chunk-tokens must be a positive multiple of 16 (the cache's block size)");
  }
  if (cached_tokens <= 0 || cached_tokens % chunk_tokens != 0 || cached_tokens >= prompt_tokens) {
    bad_flag("--cached-tokens must be a positive multiple of --chunk-tokens (" +
             std::to_string(chunk_tokens) + ") and below --prompt-tokens (" +
             std::to_string(prompt_tokens) + ")");
  }
  const int64_t new_tokens = prompt_tokens - cached_tokens;

  // GPU runtime and streams.
  std::unique_ptr<kvtier::gpu::Runtime> runtime;
  if (backend == "host") {
    runtime = kvtier::gpu::Runtime::CreateHost();
  } else {
    CheckGpu(kvtier::gpu::Runtime::CreateCuda(device, &runtime), "CUDA runtime");
  }
  kvtier::gpu::Runtime& rt = *runtime;
  kvtier::gpu::Stream compute, load, store;
  for (kvtier::gpu::Stream* s : {&compute, &load, &store}) CheckGpu(rt.CreateStream(s), "stream");

  // kvtierd: a namespace of this model with a fresh salt, so this run stores its own KV.
  kvtier::ClientOptions copts;
  copts.socket_path = socket_path;
  copts.deadline = std::chrono::milliseconds(deadline_ms);  // it measures; no failing open
  copts.client_name = "kvtier-engine";
  std::unique_ptr<kvtier::Client> client = Must(kvtier::Client::Connect(copts), "connect");
  if (!client->connected()) Die("kvtierd is not reachable" + (socket_path.empty() ? "" : " at " + socket_path));
  const std::string salt = "kvtier-engine-" + std::to_string(getpid()) + "-" +
                           std::to_string(Clock::now().time_since_epoch().count());
  const kvtier::NamespaceHandle ns =
      Must(client->OpenNamespace(shape.Namespace(chunk_tokens, salt)), "OpenNamespace");

  const std::vector<int32_t> prompt = MakePrompt(prompt_tokens);
  const std::span<const int32_t> prefix(prompt.data(), static_cast<size_t>(cached_tokens));
  std::unique_ptr<Engine> engine = Must(Engine::Create(rt, shape, prompt, compute), "engine");
  PagedCache stored_cache, serve_cache;  // A: prefill + store; B: the three ways of serving
  Check(engine->CreateCache(1, &stored_cache), "cache A");
  Check(engine->CreateCache(2, &serve_cache), "cache B");
  kvtier::GpuArena arena(rt);
  auto sync = [&](kvtier::gpu::Stream& s, const char* what) { CheckGpu(rt.Synchronize(s), what); };

  // 1. Prefill the whole prompt into cache A, storing the prefix chunks layer by layer.
  const uint32_t expect_chunks = static_cast<uint32_t>(cached_tokens / chunk_tokens);
  Clock::time_point t0 = Clock::now();
  kvtier::StoreResult stored;
  {
    kvtier::LayerwiseStorer storer(*client, ns, arena, stored_cache.desc, rt);
    const uint32_t n = Must(storer.Start(prefix, stored_cache.block_table, store), "store start");
    if (n != expect_chunks) {
      Die("kvtierd reserved " + std::to_string(n) + " of " + std::to_string(expect_chunks) +
          " chunks (is the DRAM tier big enough?)");
    }
    kvtier::engine::LayerHooks hooks;
    hooks.after_kv_append = [&](int64_t l) { return storer.LayerDone(l, compute); };
    Check(engine->Forward(stored_cache, 0, prompt_tokens, compute, hooks), "prefill");
    sync(compute, "prefill");
    stored = Must(storer.Finish(), "store finish");
  }
  const double prefill_store_ms = Ms(Clock::now() - t0);
  Check(stored.fail_open, "layerwise store");
  if (stored.stored_chunks != expect_chunks) {
    Die("stored " + std::to_string(stored.stored_chunks) + " of " + std::to_string(expect_chunks) +
        " chunks");
  }

  // Negative control: before any load, cache B (zeros) must differ from cache A, or the
  // bit-exact check below could not fail.
  const Comparison control = ComparePrefix(rt, compute, stored_cache, serve_cache, cached_tokens);
  if (control.differing_rows == 0) Die("the stored KV is all zeros: the check would be vacuous");

  uint64_t verified_bytes = 0, differing_rows = 0;
  auto verify = [&] {
    const Comparison c = ComparePrefix(rt, compute, stored_cache, serve_cache, cached_tokens);
    verified_bytes += c.compared_bytes;
    differing_rows += c.differing_rows;
  };
  // Starts a load of the prefix into cache B; dies unless the whole prefix is delivered.
  auto start_load = [&](kvtier::LayerwiseLoader& loader) {
    const uint64_t got =
        Must(loader.StartLoad(prompt, serve_cache.block_table, load), "StartLoad");
    if (got != static_cast<uint64_t>(cached_tokens)) {
      Die("kvtierd delivered " + std::to_string(got) + " of " + std::to_string(cached_tokens) +
          " cached tokens");
    }
  };
  auto finish_load = [&](kvtier::LayerwiseLoader& loader) {
    const std::vector<int32_t> redo = Must(loader.Finish(), "load finish");
    if (!redo.empty()) Die(std::to_string(redo.size()) + " blocks failed to load");
  };
  auto clear_serve_cache = [&] {
    Check(engine->ClearCache(serve_cache, compute), "clear");
    sync(compute, "clear");
  };

  std::vector<double> recompute_ms, load_then_ms, layerwise_ms, load_only_ms, compute_only_ms,
      plain_gemm_ms;
  std::vector<float> logits_a, logits_b, logits_c;
  float diff_b = 0, diff_c = 0;
  for (int it = 0; it < iterations; ++it) {
    // (a) recompute everything.
    t0 = Clock::now();
    Check(engine->Forward(serve_cache, 0, prompt_tokens, compute), "recompute");
    sync(compute, "recompute");
    recompute_ms.push_back(Ms(Clock::now() - t0));
    Check(engine->ReadLogits(compute, &logits_a), "logits");

    // The GEMM baseline: the recompute's GEMMs alone.
    t0 = Clock::now();
    Check(engine->PlainGemms(prompt_tokens, compute), "plain GEMMs");
    sync(compute, "plain GEMMs");
    plain_gemm_ms.push_back(Ms(Clock::now() - t0));

    // Load only.
    clear_serve_cache();
    t0 = Clock::now();
    {
      kvtier::LayerwiseLoader loader(*client, ns, arena, serve_cache.desc, rt);
      start_load(loader);
      sync(load, "load");
      finish_load(loader);
    }
    load_only_ms.push_back(Ms(Clock::now() - t0));
    verify();

    // Compute only: the new tokens over the (loaded) prefix.
    t0 = Clock::now();
    Check(engine->Forward(serve_cache, cached_tokens, new_tokens, compute), "compute");
    sync(compute, "compute");
    compute_only_ms.push_back(Ms(Clock::now() - t0));

    // (b) load every layer, then compute.
    clear_serve_cache();
    t0 = Clock::now();
    {
      kvtier::LayerwiseLoader loader(*client, ns, arena, serve_cache.desc, rt);
      start_load(loader);
      sync(load, "load");
      Check(engine->Forward(serve_cache, cached_tokens, new_tokens, compute), "compute (b)");
      sync(compute, "compute (b)");
      finish_load(loader);
    }
    load_then_ms.push_back(Ms(Clock::now() - t0));
    Check(engine->ReadLogits(compute, &logits_b), "logits");
    verify();

    // (c) layerwise: layer i+1 loads while layer i computes.
    clear_serve_cache();
    t0 = Clock::now();
    {
      kvtier::LayerwiseLoader loader(*client, ns, arena, serve_cache.desc, rt);
      start_load(loader);
      kvtier::engine::LayerHooks hooks;
      hooks.before_attention = [&](int64_t l) { return loader.WaitLayer(l, compute); };
      Check(engine->Forward(serve_cache, cached_tokens, new_tokens, compute, hooks),
            "compute (c)");
      sync(compute, "compute (c)");
      finish_load(loader);
    }
    layerwise_ms.push_back(Ms(Clock::now() - t0));
    Check(engine->ReadLogits(compute, &logits_c), "logits");
    verify();
    diff_b = std::max(diff_b, MaxAbsDiff(logits_a, logits_b));
    diff_c = std::max(diff_c, MaxAbsDiff(logits_a, logits_c));
  }

  const double ttft_a = Median(recompute_ms), ttft_b = Median(load_then_ms),
               ttft_c = Median(layerwise_ms), load_ms = Median(load_only_ms),
               compute_ms = Median(compute_only_ms), gemm_ms = Median(plain_gemm_ms);
  const double overlap = ttft_c / std::max(load_ms, compute_ms);
  const double recompute_tflops = engine->ForwardFlops(0, prompt_tokens) / (ttft_a * 1e9);
  const double gemm_tflops = engine->PlainGemmFlops(prompt_tokens) / (gemm_ms * 1e9);
  const double efficiency = recompute_tflops / gemm_tflops;
  const uint64_t prefix_bytes = static_cast<uint64_t>(cached_tokens) * ns.spec.BytesPerToken();
  const bool verified = differing_rows == 0 && verified_bytes > 0;
  const bool on_cuda = rt.backend() == kvtier::gpu::Backend::kCuda;

  std::printf("kvtier-engine: %s (%lld layers, %lld/%lld heads, head_dim %lld, hidden %lld), "
              "fp16, on %s\n",
              shape.name.c_str(), (long long)shape.num_layers, (long long)shape.num_q_heads,
              (long long)shape.num_kv_heads, (long long)shape.head_dim, (long long)shape.hidden,
              std::string(rt.name()).c_str());
  std::printf("prompt %lld tokens, cached prefix %lld tokens (%u chunks, %.1f MiB of KV), "
              "%d iterations, medians\n",
              (long long)prompt_tokens, (long long)cached_tokens, expect_chunks,
              prefix_bytes / 1048576.0, iterations);
  std::printf("prefill + layerwise store:              %10.2f ms (%u chunks stored)\n",
              prefill_store_ms, stored.stored_chunks);
  std::printf("TTFT (a) recompute everything:          %10.2f ms\n", ttft_a);
  std::printf("TTFT (b) load prefix, then compute:     %10.2f ms (%.2fx of a)\n", ttft_b,
              ttft_b / ttft_a);
  std::printf("TTFT (c) layerwise load + compute:      %10.2f ms (%.2fx of a)\n", ttft_c,
              ttft_c / ttft_a);
  std::printf("load only:                              %10.2f ms (%.2f GB/s)\n", load_ms,
              prefix_bytes / (load_ms * 1e6));
  std::printf("compute only (%lld new tokens):        %10.2f ms\n", (long long)new_tokens,
              compute_ms);
  std::printf("overlap ratio (c) / max(load, compute): %10.3f (1 = full overlap, %.3f = none)\n",
              overlap, (load_ms + compute_ms) / std::max(load_ms, compute_ms));
  std::printf("recompute %.3f TFLOP/s vs plain GEMMs of the same shapes %.3f TFLOP/s: ratio %.3f\n",
              recompute_tflops, gemm_tflops, efficiency);
  if (on_cuda && efficiency < 0.5) {
    std::printf("WARNING: recompute reaches under half the plain GEMM rate; the recompute "
                "baseline is too slow for an honest comparison\n");
  }
  std::printf("verify: %s: %llu bytes of loaded KV compared with the stored KV, %llu rows "
              "differ (control before loading: %llu rows differ)\n",
              verified ? "OK" : "FAILED", (unsigned long long)verified_bytes,
              (unsigned long long)differing_rows, (unsigned long long)control.differing_rows);
  std::printf("first-token logits, max |diff| vs recompute: (b) %g, (c) %g\n", diff_b, diff_c);

  if (!json_path.empty()) {
    nlohmann::json j;
    j["backend"] = std::string(rt.name());
    j["model"] = shape.name;
    j["prompt_tokens"] = prompt_tokens;
    j["cached_tokens"] = cached_tokens;
    j["new_tokens"] = new_tokens;
    j["chunk_tokens"] = chunk_tokens;
    j["iterations"] = iterations;
    j["prefill_store_ms"] = prefill_store_ms;
    j["stored_chunks"] = stored.stored_chunks;
    j["ttft_ms"] = {{"recompute", ttft_a}, {"load_then_compute", ttft_b}, {"layerwise", ttft_c}};
    j["load_only_ms"] = load_ms;
    j["compute_only_ms"] = compute_ms;
    j["overlap_ratio"] = overlap;
    j["prefix_kv_bytes"] = prefix_bytes;
    j["load_gb_per_s"] = prefix_bytes / (load_ms * 1e6);
    j["recompute_tflops"] = recompute_tflops;
    j["plain_gemm_tflops"] = gemm_tflops;
    j["recompute_vs_gemm_ratio"] = efficiency;
    j["runs_ms"] = {{"recompute", recompute_ms},     {"load_then_compute", load_then_ms},
                    {"layerwise", layerwise_ms},     {"load_only", load_only_ms},
                    {"compute_only", compute_only_ms}, {"plain_gemm", plain_gemm_ms}};
    j["verify"] = {{"ok", verified},
                   {"compared_bytes", verified_bytes},
                   {"differing_rows", differing_rows},
                   {"control_differing_rows", control.differing_rows}};
    j["logits_max_abs_diff"] = {{"load_then_compute", diff_b}, {"layerwise", diff_c}};
    const std::string text = j.dump(2) + "\n";
    if (json_path == "-") {
      std::fputs(text.c_str(), stdout);
    } else {
      std::ofstream out(json_path);
      out << text;
      if (!out) Die("cannot write " + json_path);
    }
  }
  return verified ? 0 : 1;
}
