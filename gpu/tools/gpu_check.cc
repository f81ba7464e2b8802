// gpu-check: a plain program (no GoogleTest) for a GPU machine that has only nvcc + cmake.
//   1. Round trips for every layout preset x element size x block size x copy path: the
//      backend's gather must equal the host emulation's gather (the host emulation is
//      checked against an independent CPU reference in CI), its scatter must equal the
//      host's scatter, and gather(scatter(gather(x))) == gather(x).
//   2. H2D GB/s from a cudaHostRegister'ed range vs from cudaHostAlloc memory (ratio).
//   3. Layer gather/scatter GB/s for both copy paths (ratio to the H2D baseline).
// Usage: gpu-check [--backend cuda|host] [--device N] [--quick]
// Exit: 0 all checks passed, 1 a check failed, 2 usage or backend unavailable.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kvtier/gpu/kv_transfer.h"
#include "kvtier/gpu/runtime.h"

#if KVTIER_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kvtier::gpu {
namespace {

using Clock = std::chrono::steady_clock;

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};
using HostBytes = std::unique_ptr<uint8_t, AlignedFree>;

HostBytes AllocHost(size_t bytes) {
  return HostBytes(static_cast<uint8_t*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096)));
}

bool Check(const GpuStatus& s, const std::string& what) {
  if (!s.ok()) std::printf("  FAIL %s: %s\n", what.c_str(), s.ToString().c_str());
  return s.ok();
}

// One runtime's view of a case: layer tensors, a registered arena of chunk payloads.
struct Rig {
  Runtime* runtime = nullptr;
  Stream stream;
  std::vector<DeviceBuffer> tensors;  // [layer * num_tensors + t]
  std::vector<LayerTensors> layers;
  HostBytes arena;
  size_t arena_bytes = 0;
  PinnedRange pinned;
  std::vector<void*> payloads;

  bool Init(Runtime& rt, const KvLayout& layout, int64_t num_layers, int64_t num_chunks,
            int64_t chunk_tokens) {
    runtime = &rt;
    if (!Check(rt.CreateStream(&stream), "CreateStream")) return false;
    const int nt = layout.num_tensors();
    tensors.resize(num_layers * nt);
    layers.resize(num_layers);
    for (int64_t l = 0; l < num_layers; ++l) {
      for (int t = 0; t < nt; ++t) {
        if (!Check(rt.Allocate(layout.tensor_span_bytes(t), &tensors[l * nt + t]), "Allocate")) {
          return false;
        }
        layers[l].tensors[t] = tensors[l * nt + t].data();
      }
    }
    const size_t payload_bytes = layout.LayerPayloadBytes(chunk_tokens) * num_layers;
    arena_bytes = payload_bytes * num_chunks;
    arena = AllocHost(arena_bytes);
    std::memset(arena.get(), 0xA5, arena_bytes);
    for (int64_t c = 0; c < num_chunks; ++c) payloads.push_back(arena.get() + c * payload_bytes);
    return Check(rt.RegisterHost(arena.get(), arena_bytes, PinOptions(), &pinned), "RegisterHost");
  }
  bool Fill(uint64_t seed) {
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (!Check(runtime->LaunchFill(tensors[i].data(), tensors[i].size_bytes(), seed + i, stream),
                 "LaunchFill")) {
        return false;
      }
    }
    return Check(runtime->Synchronize(stream), "Synchronize");
  }
  bool Run(const KvChunkSet& chunks, CopyPath path, KvCopyDirection dir) {
    KvTransferOptions options;
    options.path = path;
    std::unique_ptr<KvTransfer> transfer;
    if (!Check(KvTransfer::Create(*runtime, chunks, options, stream, &transfer), "KvTransfer")) {
      return false;
    }
    for (int64_t l = 0; l < chunks.num_layers; ++l) {
      if (!Check(transfer->QueueLayer(l, dir, layers[l]), "QueueLayer")) return false;
    }
    if (!Check(runtime->Synchronize(stream), "Synchronize")) return false;
    return transfer->Report().failed_chunks.empty();
  }
  std::vector<uint8_t> TensorBytes() {
    std::vector<uint8_t> all;
    for (DeviceBuffer& b : tensors) {
      std::vector<uint8_t> host(b.size_bytes());
      (void)runtime->CopyAsync(host.data(), b.data(), host.size(), stream);
      (void)runtime->Synchronize(stream);
      all.insert(all.end(), host.begin(), host.end());
    }
    return all;
  }
  std::vector<uint8_t> ArenaBytes() const { return {arena.get(), arena.get() + arena_bytes}; }
};

bool RoundTrip(Runtime& device, Runtime& host, const KvLayoutSpec& spec, CopyPath path,
               int64_t chunk_tokens) {
  KvLayout layout;
  if (!Check(KvLayout::Create(spec, &layout), "KvLayout")) return false;
  const int64_t num_layers = 2, num_chunks = 3;
  const int64_t bpc = chunk_tokens / spec.block_size_tokens;
  std::vector<int32_t> ids;  // Reversed, interleaved: blocks out of order.
  for (int64_t i = num_chunks * bpc - 1; i >= 0; --i)
    ids.push_back(static_cast<int32_t>(2 * i + 1));
  Rig dev, ref;
  if (!dev.Init(device, layout, num_layers, num_chunks, chunk_tokens) ||
      !ref.Init(host, layout, num_layers, num_chunks, chunk_tokens)) {
    return false;
  }
  KvChunkSet dev_chunks{&layout, num_layers, chunk_tokens, &dev.pinned, dev.payloads, ids};
  KvChunkSet ref_chunks{&layout, num_layers, chunk_tokens, &ref.pinned, ref.payloads, ids};
  bool ok = dev.Fill(11) && ref.Fill(11) &&
            dev.Run(dev_chunks, path, KvCopyDirection::kCacheToPayload) &&
            ref.Run(ref_chunks, path, KvCopyDirection::kCacheToPayload);
  if (ok && dev.ArenaBytes() != ref.ArenaBytes()) {
    std::printf("  FAIL gather differs from host emulation\n");
    ok = false;
  }
  const std::vector<uint8_t> gathered = dev.ArenaBytes();
  ok = ok && dev.Fill(77) && ref.Fill(77) &&
       dev.Run(dev_chunks, path, KvCopyDirection::kPayloadToCache) &&
       ref.Run(ref_chunks, path, KvCopyDirection::kPayloadToCache);
  if (ok && dev.TensorBytes() != ref.TensorBytes()) {
    std::printf("  FAIL scatter differs from host emulation\n");
    ok = false;
  }
  std::memset(dev.arena.get(), 0, dev.arena_bytes);
  ok = ok && dev.Run(dev_chunks, path, KvCopyDirection::kCacheToPayload);
  if (ok && dev.ArenaBytes() != gathered) {
    std::printf("  FAIL gather(scatter(gather(x))) != gather(x)\n");
    ok = false;
  }
  return ok;
}

int RunRoundTrips(Runtime& device, bool quick) {
  std::unique_ptr<Runtime> host = Runtime::CreateHost();
  const int64_t chunk_tokens = quick ? 32 : 64;
  int failures = 0, cases = 0;
  for (uint32_t e : {1u, 2u, 4u}) {
    for (int64_t bs : {int64_t{1}, int64_t{16}, chunk_tokens}) {
      const int64_t nb = 2 * 3 * chunk_tokens / bs + 1;
      std::vector<std::pair<std::string, KvLayoutSpec>> specs = {
          {"vllm_flash_attn", KvLayoutSpec::VllmFlashAttn(nb, bs, 4, 64, e)},
          {"vllm_flash_attn_hnd", KvLayoutSpec::VllmFlashAttn(nb, bs, 4, 64, e)},
          {"vllm_flashinfer", KvLayoutSpec::VllmFlashInfer(nb, bs, 4, 64, e)},
          {"sglang_mha", KvLayoutSpec::SglangMha(nb, bs, 4, 64, e)},
          {"mla", KvLayoutSpec::Mla(nb, bs, 576, e)},
      };
      specs[1].second.strides = {nb * 4 * bs * 64, 4 * bs * 64, 64, bs * 64, 1};
      for (const auto& [name, spec] : specs) {
        for (CopyPath path : {CopyPath::kDma, CopyPath::kZeroCopy}) {
          ++cases;
          const bool ok = RoundTrip(device, *host, spec, path, chunk_tokens);
          failures += ok ? 0 : 1;
          if (!ok || !quick) {
            std::printf("%s round trip %-20s e=%u bs=%-3lld %-9s\n", ok ? "ok  " : "FAIL",
                        name.c_str(), e, static_cast<long long>(bs),
                        std::string(CopyPathName(path)).c_str());
          }
        }
      }
    }
  }
  std::printf("round trips: %d of %d passed\n", cases - failures, cases);
  return failures;
}

// Seconds per repetition of `fn` (which queues work on `stream`), after one warm-up.
template <typename Fn>
double TimeIt(Runtime& rt, Stream& stream, int reps, Fn fn) {
  fn();
  (void)rt.Synchronize(stream);
  const Clock::time_point start = Clock::now();
  for (int i = 0; i < reps; ++i) fn();
  (void)rt.Synchronize(stream);
  return std::chrono::duration<double>(Clock::now() - start).count() / reps;
}

double H2dGbps(Runtime& rt, bool quick) {
  const size_t bytes = quick ? (size_t{64} << 20) : (size_t{1} << 30);
  const int reps = quick ? 3 : 10;
  Stream stream;
  DeviceBuffer dst;
  if (!Check(rt.CreateStream(&stream), "CreateStream") ||
      !Check(rt.Allocate(bytes, &dst), "Allocate")) {
    return 0;
  }
  HostBytes registered = AllocHost(bytes);
  std::memset(registered.get(), 1, bytes);
  PinnedRange pinned;
  if (!Check(rt.RegisterHost(registered.get(), bytes, PinOptions(), &pinned), "RegisterHost"))
    return 0;
  const double reg_s = TimeIt(
      rt, stream, reps, [&] { (void)rt.CopyAsync(dst.data(), registered.get(), bytes, stream); });
  const double reg_gbps = bytes / reg_s / 1e9;
  std::printf("H2D %zu MiB from cudaHostRegister range: %8.2f GB/s\n", bytes >> 20, reg_gbps);
#if KVTIER_HAVE_CUDA
  if (rt.backend() == Backend::kCuda) {
    void* alloc = nullptr;
    if (cudaHostAlloc(&alloc, bytes, cudaHostAllocDefault) != cudaSuccess) {
      std::printf("H2D from cudaHostAlloc: allocation failed\n");
      return reg_gbps;
    }
    std::memset(alloc, 1, bytes);
    const double alloc_s =
        TimeIt(rt, stream, reps, [&] { (void)rt.CopyAsync(dst.data(), alloc, bytes, stream); });
    const double alloc_gbps = bytes / alloc_s / 1e9;
    std::printf(
        "H2D %zu MiB from cudaHostAlloc memory:   %8.2f GB/s  (registered / hostalloc = %.3f)\n",
        bytes >> 20, alloc_gbps, reg_gbps / alloc_gbps);
    cudaFreeHost(alloc);
    return alloc_gbps;
  }
#endif
  std::printf("H2D from cudaHostAlloc: n/a on backend %s\n", std::string(rt.name()).c_str());
  return reg_gbps;
}

// A realistic model: vLLM flash-attn fp16, 8 KV heads x 128, block 16, 256-token chunks.
bool LayerCopyGbps(Runtime& rt, bool quick, double h2d_gbps) {
  const int64_t chunk_tokens = 256, bs = 16, num_layers = 4;
  const int64_t num_chunks = quick ? 16 : 128;  // 1 MiB per chunk and layer.
  const int64_t bpc = chunk_tokens / bs;
  KvLayout layout;
  if (!Check(KvLayout::Create(KvLayoutSpec::VllmFlashAttn(num_chunks * bpc + 7, bs, 8, 128, 2),
                              &layout),
             "KvLayout")) {
    return false;
  }
  Rig rig;
  if (!rig.Init(rt, layout, num_layers, num_chunks, chunk_tokens) || !rig.Fill(3)) return false;
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < num_chunks * bpc; ++i)
    ids.push_back(static_cast<int32_t>((i * 7) % (num_chunks * bpc)));
  const KvChunkSet chunks{&layout, num_layers, chunk_tokens, &rig.pinned, rig.payloads, ids};
  const double bytes =
      static_cast<double>(layout.LayerPayloadBytes(chunk_tokens)) * num_chunks * num_layers;
  for (CopyPath path : {CopyPath::kDma, CopyPath::kZeroCopy}) {
    for (KvCopyDirection dir :
         {KvCopyDirection::kPayloadToCache, KvCopyDirection::kCacheToPayload}) {
      KvTransferOptions options;
      options.path = path;
      std::unique_ptr<KvTransfer> transfer;
      if (!Check(KvTransfer::Create(rt, chunks, options, rig.stream, &transfer), "KvTransfer"))
        return false;
      const double s = TimeIt(rt, rig.stream, quick ? 2 : 5, [&] {
        for (int64_t l = 0; l < num_layers; ++l) (void)transfer->QueueLayer(l, dir, rig.layers[l]);
      });
      const double gbps = bytes / s / 1e9;
      std::printf("%-7s %-9s %lld chunks x %lld layers: %8.2f GB/s  (/ H2D baseline = %.3f)\n",
                  dir == KvCopyDirection::kPayloadToCache ? "scatter" : "gather",
                  std::string(CopyPathName(path)).c_str(), static_cast<long long>(num_chunks),
                  static_cast<long long>(num_layers), gbps, h2d_gbps > 0 ? gbps / h2d_gbps : 0.0);
      if (!transfer->Report().failed_chunks.empty()) return false;
    }
  }
  return true;
}

int Main(int argc, char** argv) {
  std::string backend = "cuda";
  int device = 0;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") {
      quick = true;
    } else if (arg == "--backend" && i + 1 < argc) {
      backend = argv[++i];
    } else if (arg == "--device" && i + 1 < argc) {
      device = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: gpu-check [--backend cuda|host] [--device N] [--quick]\n");
      return 2;
    }
  }
  std::unique_ptr<Runtime> rt;
  if (backend == "host") {
    rt = Runtime::CreateHost();
  } else if (backend == "cuda") {
    if (GpuStatus s = Runtime::CreateCuda(device, &rt); !s.ok()) {
      std::fprintf(stderr, "gpu-check: no CUDA backend: %s\n", s.ToString().c_str());
      return 2;
    }
  } else {
    std::fprintf(stderr, "gpu-check: unknown backend '%s'\n", backend.c_str());
    return 2;
  }
  std::printf("gpu-check on %s (default copy path: %s)\n", std::string(rt->name()).c_str(),
              std::string(CopyPathName(kDefaultCopyPath)).c_str());
  int failures = RunRoundTrips(*rt, quick);
  const double h2d = H2dGbps(*rt, quick);
  if (!LayerCopyGbps(*rt, quick, h2d)) ++failures;
  std::printf("%s\n", failures == 0 ? "PASS" : "FAIL");
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace kvtier::gpu

int main(int argc, char** argv) { return kvtier::gpu::Main(argc, argv); }
