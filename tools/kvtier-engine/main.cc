// kvtier-engine: the test engine (gpu/include/kvtier/gpu/engine/engine.h) with a real paged
// KV cache, against kvtierd: serves one prompt three ways (gpu::engine::TtftBench) and prints
// the time to first token (TTFT) of each:
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
// (kvtier-engine-standalone, gpu/tools/engine_standalone.cc, runs the same with a pinned
// host buffer in place of kvtierd, for a GPU machine with only the CUDA toolkit.)
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

#include "daemon_kv_source.h"
#include "kvtier/client.h"
#include "kvtier/gpu/engine/engine.h"
#include "kvtier/gpu/engine/model_shape.h"
#include "kvtier/gpu/engine/ttft_bench.h"
#include "kvtier/gpu/runtime.h"
#include "kvtier/layerwise.h"
#include "kvtier/logging.h"
#include "kvtier/namespace_spec.h"

namespace {

using Clock = std::chrono::steady_clock;
using kvtier::Status;
using kvtier::gpu::engine::Engine;
using kvtier::gpu::engine::MakePrompt;
using kvtier::gpu::engine::ModelShape;
using kvtier::gpu::engine::PagedCache;

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

// The kvtier namespace of the engine's KV cache (fp16, vLLM flash-attn layout, mha).
kvtier::NamespaceSpec ModelNamespace(const ModelShape& shape, uint32_t chunk_tokens,
                                     const std::string& cache_salt) {
  kvtier::NamespaceSpec ns;
  ns.model_id = "kvtier-engine/" + shape.name;
  ns.kv_dtype = "fp16";
  ns.layout = "mha";
  ns.num_layers = static_cast<uint32_t>(shape.num_layers);
  ns.num_kv_heads = static_cast<uint32_t>(shape.num_kv_heads);
  ns.head_dim = static_cast<uint32_t>(shape.head_dim);
  ns.chunk_tokens = chunk_tokens;
  ns.cache_salt = cache_salt;
  return ns;
}

}  // namespace

int main(int argc, char** argv) {
  kvtier::LogToStderr("kvtier-engine");  // results go to stdout; logs, the SDK's too, to stderr
  std::string socket_path, backend = "cuda", model = "llama3-8b", json_path;
  int64_t prompt_tokens = 8192, cached_tokens = 6144;
  uint32_t chunk_tokens = 256;
  int iterations = 3, device = 0, deadline_ms = 10000;
  CLI::App app{
      "kvtier-engine: TTFT of recompute vs load-then-compute vs layerwise load, with a "
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

  ModelShape shape;
  CheckGpu(ModelShape::Preset(model, &shape), "model");
  auto bad_flag = [](const std::string& msg) {
    std::fprintf(stderr, "kvtier-engine: %s\n", msg.c_str());
    std::exit(2);
  };
  if (chunk_tokens == 0 || chunk_tokens % kvtier::gpu::engine::kBlockTokens != 0) {
    bad_flag("--chunk-tokens must be a positive multiple of 16 (the cache's block size)");
  }
  if (cached_tokens <= 0 || cached_tokens % chunk_tokens != 0 || cached_tokens >= prompt_tokens) {
    bad_flag("--cached-tokens must be a positive multiple of --chunk-tokens (" +
             std::to_string(chunk_tokens) + ") and below --prompt-tokens (" +
             std::to_string(prompt_tokens) + ")");
  }
  const int64_t new_tokens = prompt_tokens - cached_tokens;
  // With --json - stdout is the JSON alone; the table goes to stderr. A file is
  // checked before the run, not after minutes of it.
  FILE* const table = json_path == "-" ? stderr : stdout;
  if (!json_path.empty() && json_path != "-" && !std::ofstream(json_path, std::ios::app)) {
    bad_flag("--json: cannot write " + json_path);
  }

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
  if (!client->connected()) {
    Die("kvtierd is not reachable" + (socket_path.empty() ? "" : " at " + socket_path));
  }
  const std::string salt = "kvtier-engine-" + std::to_string(getpid()) + "-" +
                           std::to_string(Clock::now().time_since_epoch().count());
  const kvtier::NamespaceHandle ns =
      Must(client->OpenNamespace(ModelNamespace(shape, chunk_tokens, salt)), "OpenNamespace");

  const std::vector<int32_t> prompt = MakePrompt(prompt_tokens);
  const std::span<const int32_t> prefix(prompt.data(), static_cast<size_t>(cached_tokens));
  std::unique_ptr<Engine> engine;
  CheckGpu(Engine::Create(rt, shape, prompt, compute, &engine), "engine");
  PagedCache stored_cache, serve_cache;  // A: prefill + store; B: the three ways of serving
  CheckGpu(engine->CreateCache(1, &stored_cache), "cache A");
  CheckGpu(engine->CreateCache(2, &serve_cache), "cache B");
  kvtier::GpuArena arena(rt);
  auto sync = [&](kvtier::gpu::Stream& s, const char* what) { CheckGpu(rt.Synchronize(s), what); };

  // 1. Prefill the whole prompt into cache A, storing the prefix chunks layer by layer.
  const uint32_t expect_chunks = static_cast<uint32_t>(cached_tokens / chunk_tokens);
  Clock::time_point t0 = Clock::now();
  kvtier::StoreResult stored;
  {
    kvtier::LayerwiseStorer storer(
        *client, ns, arena, kvtier::PagedKvCache{stored_cache.spec, stored_cache.layer_tensors},
        rt);
    const uint32_t n = Must(storer.Start(prefix, stored_cache.block_table, store), "store start");
    if (n != expect_chunks) {
      Die("kvtierd reserved " + std::to_string(n) + " of " + std::to_string(expect_chunks) +
          " chunks (is the DRAM tier big enough?)");
    }
    kvtier::gpu::engine::LayerHooks hooks;
    hooks.after_kv_append = [&](int64_t l) -> kvtier::gpu::GpuStatus {
      const Status s = storer.LayerDone(l, compute);
      return s.ok() ? kvtier::gpu::GpuStatus::Ok()
                    : kvtier::gpu::GpuStatus::Unavailable(s.ToString());
    };
    CheckGpu(engine->Forward(stored_cache, 0, prompt_tokens, compute, hooks), "prefill");
    sync(compute, "prefill");
    stored = Must(storer.Finish(), "store finish");
  }
  const double prefill_store_ms = Ms(Clock::now() - t0);
  Check(stored.fail_open, "layerwise store");
  if (stored.stored_chunks != expect_chunks) {
    Die("stored " + std::to_string(stored.stored_chunks) + " of " + std::to_string(expect_chunks) +
        " chunks");
  }

  // 2. The three ways, loading from kvtierd.
  kvtier::engine::DaemonKvSource source(*client, ns, arena, rt, prompt, cached_tokens);
  kvtier::gpu::engine::TtftOptions options;
  options.prompt_tokens = prompt_tokens;
  options.cached_tokens = cached_tokens;
  options.iterations = iterations;
  kvtier::gpu::engine::TtftReport report;
  kvtier::gpu::engine::TtftBench bench(rt, *engine, compute, load);
  CheckGpu(bench.Run(stored_cache, serve_cache, source, options, &report), "TTFT runs");
  const uint64_t prefix_bytes = static_cast<uint64_t>(cached_tokens) * ns.spec.BytesPerToken();
  if (prefix_bytes != report.prefix_kv_bytes) {
    Die("the namespace's KV bytes differ from the cache's");
  }

  std::fprintf(table,
               "kvtier-engine: %s (%lld layers, %lld/%lld heads, head_dim %lld, hidden %lld), "
               "fp16, on %s\n",
               shape.name.c_str(), (long long)shape.num_layers, (long long)shape.num_q_heads,
               (long long)shape.num_kv_heads, (long long)shape.head_dim, (long long)shape.hidden,
               std::string(rt.name()).c_str());
  std::fprintf(table,
               "prompt %lld tokens, cached prefix %lld tokens (%u chunks, %.1f MiB of KV), "
               "%d iterations, medians\n",
               (long long)prompt_tokens, (long long)cached_tokens, expect_chunks,
               prefix_bytes / 1048576.0, iterations);
  std::fprintf(table, "prefill + layerwise store:              %10.2f ms (%u chunks stored)\n",
               prefill_store_ms, stored.stored_chunks);
  report.Print(table);

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
    j["ttft_ms"] = {{"recompute", report.ttft_recompute_ms},
                    {"load_then_compute", report.ttft_load_then_compute_ms},
                    {"layerwise", report.ttft_layerwise_ms}};
    j["load_only_ms"] = report.load_ms;
    j["compute_only_ms"] = report.compute_ms;
    j["overlap_ratio"] = report.overlap_ratio;
    j["prefix_kv_bytes"] = prefix_bytes;
    j["load_gb_per_s"] = report.load_gb_per_s;
    j["recompute_tflops"] = report.recompute_tflops;
    j["plain_gemm_tflops"] = report.plain_gemm_tflops;
    j["recompute_vs_gemm_ratio"] = report.recompute_vs_gemm_ratio;
    j["runs_ms"] = {{"recompute", report.recompute_ms},
                    {"load_then_compute", report.load_then_compute_ms},
                    {"layerwise", report.layerwise_ms},
                    {"load_only", report.load_only_ms},
                    {"compute_only", report.compute_only_ms},
                    {"plain_gemm", report.plain_gemm_ms}};
    j["verify"] = {{"ok", report.verified()},
                   {"compared_bytes", report.verified_bytes},
                   {"differing_rows", report.differing_rows},
                   {"control_differing_rows", report.control_differing_rows}};
    j["logits_max_abs_diff"] = {{"load_then_compute", report.logits_diff_load_then_compute},
                                {"layerwise", report.logits_diff_layerwise}};
    const std::string text = j.dump(2) + "\n";
    if (json_path == "-") {
      std::fputs(text.c_str(), stdout);
    } else {
      std::ofstream out(json_path);
      out << text;
      if (!out) Die("cannot write " + json_path);
    }
  }
  return report.verified() ? 0 : 1;
}
