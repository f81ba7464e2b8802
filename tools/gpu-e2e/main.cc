// kvtier-gpu-e2e: end-to-end check of the GPU path through a running kvtierd.
// Fills a paged KV cache (vLLM flash-attn layout) on the device with random
// bytes, stores a prompt's chunks layer by layer (LayerwiseStorer: D2H into
// the shared arena), loads them into a second cache at other block ids
// (LayerwiseLoader: H2D), and compares every loaded byte with what was
// stored. When the daemon has an HBM tier (--hbm-bytes), it then has the
// prefix copied into the HBM pool (Prefetch to_hbm) and loads it again, device
// to device from the pool opened over CUDA IPC, and verifies again. Prints the
// D2H, H2D and D2D GB/s the client saw. Exit 0 when every byte matched, 3
// when one did not, 1 on other failures (or --require-hbm without an HBM
// load), 2 on usage errors.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <thread>

#include "kvtier/layerwise.h"
#include "kvtier/logging.h"

namespace {

using Clock = std::chrono::steady_clock;

int Fail(const std::string& what) {
  std::fprintf(stderr, "kvtier-gpu-e2e: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  kvtier::LogToStderr("gpu-e2e");  // results go to stdout; logs, the SDK's too, to stderr
  std::string socket_path, backend = "cuda";
  int device = 0;
  int64_t layers = 32, heads = 8, head_dim = 128, block = 16, chunk_tokens = 256;
  int64_t prompt_tokens = 8192;
  bool require_hbm = false;
  CLI::App app{"kvtier-gpu-e2e: store and load a prompt's KV through kvtierd on the GPU",
               "kvtier-gpu-e2e"};
  app.add_option("--socket", socket_path, "kvtierd socket (default: the daemon's default)");
  app.add_option("--backend", backend, "cuda or host (emulation)")
      ->check(CLI::IsMember({"cuda", "host"}))
      ->capture_default_str();
  app.add_option("--device", device, "CUDA device")->capture_default_str();
  app.add_option("--layers", layers)->check(CLI::Range(1, 512))->capture_default_str();
  app.add_option("--kv-heads", heads)->check(CLI::Range(1, 256))->capture_default_str();
  app.add_option("--head-dim", head_dim)->check(CLI::Range(1, 1024))->capture_default_str();
  app.add_option("--block-size", block, "tokens per engine block")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--chunk-tokens", chunk_tokens)
      ->check(CLI::Range(1, 65536))
      ->capture_default_str();
  app.add_option("--prompt-tokens", prompt_tokens)
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 22))
      ->capture_default_str();
  app.add_flag("--require-hbm", require_hbm,
               "fail unless the second load came from the daemon's HBM pool");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (chunk_tokens % block != 0) {
    std::fprintf(stderr, "kvtier-gpu-e2e: --block-size must divide --chunk-tokens\n");
    return 2;
  }
  const int64_t chunks = prompt_tokens / chunk_tokens;
  if (chunks == 0) {
    std::fprintf(stderr, "kvtier-gpu-e2e: --prompt-tokens holds no full chunk\n");
    return 2;
  }

  std::unique_ptr<kvtier::gpu::Runtime> rt;
  if (backend == "cuda") {
    const kvtier::gpu::GpuStatus st = kvtier::gpu::Runtime::CreateCuda(device, &rt);
    if (!st.ok()) return Fail("CUDA runtime: " + st.ToString());
  } else {
    rt = kvtier::gpu::Runtime::CreateHost();
  }

  kvtier::ClientOptions co;
  co.socket_path = socket_path;
  co.deadline = std::chrono::seconds(10);
  co.client_name = "kvtier-gpu-e2e";
  auto client = kvtier::Client::Connect(co);
  if (!client.ok()) return Fail(client.status().ToString());
  if (!(*client)->connected()) return Fail("kvtierd is not reachable");
  kvtier::NamespaceSpec spec;
  spec.model_id = "kvtier-gpu-e2e";
  spec.kv_dtype = "fp16";
  spec.layout = "mha";
  spec.num_layers = static_cast<uint32_t>(layers);
  spec.num_kv_heads = static_cast<uint32_t>(heads);
  spec.head_dim = static_cast<uint32_t>(head_dim);
  spec.chunk_tokens = static_cast<uint32_t>(chunk_tokens);
  spec.cache_salt = std::to_string(Clock::now().time_since_epoch().count());  // a fresh prefix
  auto ns = (*client)->OpenNamespace(spec);
  if (!ns.ok()) return Fail(ns.status().ToString());

  // Two caches with room for the prompt's blocks twice; the load goes to other ids.
  const int64_t blocks = 2 * ((prompt_tokens + block - 1) / block);
  kvtier::PagedKvCache caches[2];
  std::vector<kvtier::gpu::DeviceBuffer> buffers(2 * layers);
  kvtier::gpu::Stream compute, copy;
  if (!rt->CreateStream(&compute).ok() || !rt->CreateStream(&copy).ok()) return Fail("streams");
  kvtier::gpu::KvLayout layout;
  const auto lspec = kvtier::gpu::KvLayoutSpec::VllmFlashAttn(blocks, block, heads, head_dim, 2);
  if (auto st = kvtier::gpu::KvLayout::Create(lspec, &layout); !st.ok()) return Fail(st.ToString());
  const size_t tensor_bytes = layout.tensor_span_bytes(0);
  std::vector<uint8_t> host(tensor_bytes);
  std::mt19937_64 rng(42);
  for (int c = 0; c < 2; ++c) {
    caches[c].layout = lspec;
    caches[c].layers.resize(layers);
    for (int64_t l = 0; l < layers; ++l) {
      auto& buf = buffers[c * layers + l];
      if (auto st = rt->Allocate(tensor_bytes, &buf); !st.ok()) return Fail(st.ToString());
      for (auto& b : host) b = c == 0 ? static_cast<uint8_t>(rng()) : 0;
      if (!rt->CopyAsync(buf.data(), host.data(), tensor_bytes, compute).ok() ||
          !rt->Synchronize(compute).ok()) {
        return Fail("initialising the caches");
      }
      caches[c].layers[l].tensors[0] = buf.data();
    }
  }
  const int64_t prompt_blocks = (prompt_tokens + block - 1) / block;
  std::vector<int32_t> table_a(prompt_blocks), table_b(prompt_blocks);
  std::iota(table_a.begin(), table_a.end(), 0);
  std::iota(table_b.begin(), table_b.end(), static_cast<int32_t>(prompt_blocks));
  std::shuffle(table_b.begin(), table_b.end(), std::mt19937(7));
  std::vector<int32_t> tokens(prompt_tokens);
  std::iota(tokens.begin(), tokens.end(), 1);

  kvtier::GpuArena arena(*rt);
  const uint64_t bytes = static_cast<uint64_t>(chunks) * ns->layout.payload_bytes;
  // The client's first store registers the whole arena mapping with the runtime
  // (cudaHostRegister of every byte, once per client and daemon run), as an engine's
  // first request pays it: timed apart, on a one-chunk prompt of other tokens.
  std::vector<int32_t> first_tokens(chunk_tokens);
  std::iota(first_tokens.begin(), first_tokens.end(), static_cast<int32_t>(prompt_tokens) + 1);
  const auto f0 = Clock::now();
  {
    kvtier::LayerwiseStorer first(**client, *ns, arena, caches[0], *rt);
    auto one = first.Start(first_tokens, table_a, copy);
    if (!one.ok() || *one != 1) return Fail("first store: nothing reserved for its one chunk");
    for (int64_t l = 0; l < layers; ++l) {
      if (auto st = first.LayerDone(l, compute); !st.ok()) return Fail(st.ToString());
    }
    auto done = first.Finish();
    if (!done.ok() || !done->fail_open.ok() || done->stored_chunks != 1) {
      return Fail("first store did not commit its chunk");
    }
  }
  const double first_store_s = std::chrono::duration<double>(Clock::now() - f0).count();
  // Store: D2H, layer by layer.
  kvtier::LayerwiseStorer storer(**client, *ns, arena, caches[0], *rt);
  const auto s0 = Clock::now();
  auto reserved = storer.Start(tokens, table_a, copy);
  if (!reserved.ok()) return Fail("store: " + reserved.status().ToString());
  if (*reserved != chunks) {
    if (!(*client)->connected()) return Fail("store: kvtierd is not reachable any more");
    return Fail("reserved " + std::to_string(*reserved) + " of " + std::to_string(chunks) +
                " chunks (is the arena large enough? this prompt needs " +
                std::to_string(chunks * ns->layout.slot_bytes) +
                " bytes of slots, and one session holds at most half the arena unless "
                "kvtierd has --session-max-bytes)");
  }
  for (int64_t l = 0; l < layers; ++l) {
    if (auto st = storer.LayerDone(l, compute); !st.ok()) return Fail(st.ToString());
  }
  auto stored = storer.Finish();
  const double store_s = std::chrono::duration<double>(Clock::now() - s0).count();
  if (!stored.ok() || !stored->fail_open.ok() || stored->stored_chunks != chunks) {
    return Fail("store did not commit every chunk");
  }
  // Load layer by layer into cache 1 at other blocks; returns the seconds or a failure.
  auto load = [&](const char* what, const kvtier::PrefetchTicket* ticket,
                  uint32_t* hbm_chunks) -> std::optional<double> {
    kvtier::LayerwiseLoader loader(**client, *ns, arena, caches[1], *rt);
    const auto l0 = Clock::now();
    auto loaded = loader.StartLoad(tokens, table_b, copy, ticket);
    auto failed = [what](const std::string& why) -> std::optional<double> {
      Fail(std::string(what) + ": " + why);
      return std::nullopt;
    };
    if (!loaded.ok()) return failed(loaded.status().ToString());
    for (int64_t l = 0; l < layers; ++l) {
      if (auto st = loader.WaitLayer(l, compute); !st.ok()) return failed(st.ToString());
    }
    auto recompute = loader.Finish();
    const double seconds = std::chrono::duration<double>(Clock::now() - l0).count();
    if (!recompute.ok()) return failed(recompute.status().ToString());
    if (*loaded != static_cast<uint64_t>(chunks * chunk_tokens) || !recompute->empty()) {
      return failed("loaded " + std::to_string(*loaded) + " tokens, " +
                    std::to_string(recompute->size()) + " blocks to recompute");
    }
    *hbm_chunks = loader.hbm_chunks();
    return seconds;
  };
  // Every token's K and V of every layer: cache 1 at table_b vs cache 0 at table_a.
  std::vector<uint8_t> a(tensor_bytes), b(tensor_bytes);
  const int64_t token_bytes = heads * head_dim * 2;
  auto mismatched = [&]() -> std::optional<uint64_t> {
    uint64_t mismatches = 0;
    for (int64_t l = 0; l < layers; ++l) {
      if (!rt->CopyAsync(a.data(), buffers[l].data(), tensor_bytes, compute).ok() ||
          !rt->CopyAsync(b.data(), buffers[layers + l].data(), tensor_bytes, compute).ok() ||
          !rt->Synchronize(compute).ok()) {
        return std::nullopt;
      }
      for (int64_t t = 0; t < chunks * chunk_tokens; ++t) {
        for (int64_t p = 0; p < 2; ++p) {
          const int64_t oa = ((p * blocks + table_a[t / block]) * block + t % block) * token_bytes;
          const int64_t ob = ((p * blocks + table_b[t / block]) * block + t % block) * token_bytes;
          if (std::memcmp(a.data() + oa, b.data() + ob, token_bytes) != 0) ++mismatches;
        }
      }
    }
    return mismatches;
  };

  // First load: H2D from the DRAM arena.
  uint32_t hbm_chunks = 0;
  const std::optional<double> load_s = load("load", nullptr, &hbm_chunks);
  if (!load_s) return 1;
  const std::optional<uint64_t> mismatches = mismatched();
  if (!mismatches) return Fail("reading the caches back");

  // Second load: D2D from the daemon's HBM pool, once the prefix is there.
  const std::optional<kvtier::HbmPoolInfo> pool = (*client)->HbmPool();
  std::optional<double> hbm_load_s;
  std::optional<uint64_t> hbm_mismatches;
  uint32_t hbm_loaded = 0;
  if (pool) {
    kvtier::PrefetchOptions po;
    po.to_hbm = true;
    po.policy = kvtier::PrefetchPolicy::kWaitComplete;
    auto ticket = (*client)->Prefetch(*ns, tokens, po);
    if (!ticket.ok() || !ticket->fail_open.ok()) return Fail("prefetch into HBM failed");
    const auto until = Clock::now() + std::chrono::seconds(60);
    kvtier::PrefetchProgress p = (*client)->PrefetchStatus(*ticket);
    while (p.fail_open.ok() && !p.hbm_done && p.hbm_chunks < chunks && Clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      p = (*client)->PrefetchStatus(*ticket);
    }
    for (int64_t l = 0; l < layers; ++l) {  // zero cache 1 so that the check sees this load
      if (!rt->LaunchMemset(buffers[layers + l].data(), 0, tensor_bytes, compute).ok()) {
        return Fail("clearing the cache");
      }
    }
    if (!rt->Synchronize(compute).ok()) return Fail("clearing the cache");
    hbm_load_s = load("HBM load", &*ticket, &hbm_loaded);
    if (!hbm_load_s) return 1;
    hbm_mismatches = mismatched();
    if (!hbm_mismatches) return Fail("reading the caches back");
  }
  std::printf(
      "kvtier-gpu-e2e (%s backend): %lld chunks of %llu bytes (%lld layers x %lld "
      "tokens x %lld heads x %lld x fp16)\n",
      backend.c_str(), static_cast<long long>(chunks),
      static_cast<unsigned long long>(ns->layout.payload_bytes), static_cast<long long>(layers),
      static_cast<long long>(chunk_tokens), static_cast<long long>(heads),
      static_cast<long long>(head_dim));
  std::printf(
      "  first store of the client (one chunk; registers the whole arena mapping with "
      "the runtime, once)  %.3f s\n",
      first_store_s);
  std::printf("  store (D2H into the arena, layerwise)  %.3f s  %.2f GB/s\n", store_s,
              bytes / store_s / 1e9);
  std::printf("  load  (H2D from the arena, layerwise)  %.3f s  %.2f GB/s\n", *load_s,
              bytes / *load_s / 1e9);
  const long long planes = 2 * layers * chunks * chunk_tokens;
  std::printf("  verified: %llu mismatched token planes of %lld\n",
              static_cast<unsigned long long>(*mismatches), planes);
  if (!pool) {
    std::printf(
        "  HBM tier: off in kvtierd (start it with --hbm-bytes to load device to device)\n");
  } else {
    const bool all = hbm_loaded == chunks;
    const char* ipc = pool->backend == "host" ? "emulated" : "CUDA";
    if (all) {
      std::printf(
          "  load  (D2D from the HBM pool over %s IPC, layerwise)  %.3f s  %.2f GB/s  "
          "(%u of %lld chunks from HBM)\n",
          ipc, *hbm_load_s, bytes / *hbm_load_s / 1e9, hbm_loaded, static_cast<long long>(chunks));
    } else {
      std::printf(
          "  load  (mixed: D2D over %s IPC for %u of %lld chunks, H2D from DRAM for the "
          "rest)  %.3f s  %.2f GB/s\n",
          ipc, hbm_loaded, static_cast<long long>(chunks), *hbm_load_s, bytes / *hbm_load_s / 1e9);
    }
    if (!all) {
      std::printf(
          "  note: only %u chunks of %llu bytes went into the HBM pool of %llu bytes "
          "(too small for the prefix, or full of leased chunks)\n",
          hbm_loaded, static_cast<unsigned long long>(ns->layout.slot_bytes),
          static_cast<unsigned long long>(pool->pool_bytes));
    }
    std::printf("  verified (HBM load): %llu mismatched token planes of %lld\n",
                static_cast<unsigned long long>(*hbm_mismatches), planes);
  }
  if (*mismatches != 0 || (hbm_mismatches && *hbm_mismatches != 0)) return 3;
  if (require_hbm && hbm_loaded != chunks) {
    return Fail("--require-hbm: " + std::to_string(hbm_loaded) + " of " + std::to_string(chunks) +
                " chunks came from the HBM pool");
  }
  return 0;
}
