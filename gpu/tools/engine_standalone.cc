// kvtier-engine-standalone: the test engine (kvtier/gpu/engine/engine.h) with no daemon, for
// a GPU machine that has only nvcc + cmake (make gpu-check runs it). It serves one prompt
// three ways and prints the time to first token (TTFT) of each (TtftBench):
//
//   (a) recompute: prefill every prompt token.
//   (b) load, then compute: load the cached prefix with gpu::LayerwiseLoad, wait for every
//       layer, then compute the new tokens.
//   (c) layerwise: layer i+1 loads while layer i computes (LayerwiseLoad::WaitLayer before
//       each layer's attention).
//
// The KV source is a pinned host buffer (page-aligned, registered with
// Runtime::RegisterHost) holding the prefix as chunk payloads, the layout kvtierd's arena
// uses; a prefill fills it layer by layer with gpu::LayerwiseStore. Every load goes into a
// cleared cache and is compared bit for bit with the cache the prefill wrote. Baselines
// measured in the same run: load-only and compute-only times (overlap ratio of (c) = wall /
// max(load, compute)) and a plain GEMM run of the recompute's GEMM shapes.
//
// Usage: kvtier-engine-standalone [--backend cuda|host] [--device N]
//          [--model llama3-8b|tiny-engine] [--prompt-tokens N] [--cached-tokens N]
//          [--chunk-tokens N] [--iterations N] [--copy-path dma|zero_copy]
//          [--queue-ahead N]
// Exit: 0 success; 1 an error or loaded KV that differs from the stored KV; 2 bad flags or
// no usable CUDA device.
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kvtier/gpu/engine/engine.h"
#include "kvtier/gpu/engine/kv_source.h"
#include "kvtier/gpu/engine/model_shape.h"
#include "kvtier/gpu/engine/ttft_bench.h"
#include "kvtier/gpu/kv_transfer.h"
#include "kvtier/gpu/layerwise_load.h"
#include "kvtier/gpu/layerwise_store.h"
#include "kvtier/gpu/runtime.h"

namespace kvtier::gpu::engine {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kUsage[] =
    "usage: kvtier-engine-standalone [--backend cuda|host] [--device N]\n"
    "         [--model llama3-8b|tiny-engine] [--prompt-tokens N] [--cached-tokens N]\n"
    "         [--chunk-tokens N] [--iterations N] [--copy-path dma|zero_copy]\n"
    "         [--queue-ahead N]   (layers queued ahead of the engine's wait; 0: all at start)\n";

struct Flags {
  std::string backend = "cuda";
  int device = 0;
  std::string model = "llama3-8b";
  int64_t prompt_tokens = 8192;
  int64_t cached_tokens = 6144;
  int64_t chunk_tokens = 256;  // kvtier's default chunk size
  int iterations = 3;
  CopyPath copy_path = kDefaultCopyPath;
  int64_t queue_ahead = KvTransferOptions{}.queue_ahead_layers;
};

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "kvtier-engine-standalone: %s\n", what.c_str());
  std::exit(1);
}

[[noreturn]] void BadFlag(const std::string& what) {
  std::fprintf(stderr, "kvtier-engine-standalone: %s\n%s", what.c_str(), kUsage);
  std::exit(2);
}

void Check(const GpuStatus& s, const std::string& what) {
  if (!s.ok()) Die(what + ": " + s.ToString());
}

int64_t ParseInt(const std::string& flag, const char* text, int64_t min, int64_t max) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < min || v > max) {
    BadFlag(flag + " must be an integer in [" + std::to_string(min) + ", " + std::to_string(max) +
            "], not '" + text + "'");
  }
  return v;
}

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (i + 1 >= argc) BadFlag("unknown flag or missing value: " + arg);
    const char* value = argv[++i];
    if (arg == "--backend") {
      f.backend = value;
      if (f.backend != "cuda" && f.backend != "host") BadFlag("--backend must be cuda or host");
    } else if (arg == "--device") {
      f.device = static_cast<int>(ParseInt(arg, value, 0, 1024));
    } else if (arg == "--model") {
      f.model = value;
    } else if (arg == "--prompt-tokens") {
      f.prompt_tokens = ParseInt(arg, value, 2, int64_t{1} << 20);
    } else if (arg == "--cached-tokens") {
      f.cached_tokens = ParseInt(arg, value, 1, int64_t{1} << 20);
    } else if (arg == "--chunk-tokens") {
      f.chunk_tokens = ParseInt(arg, value, 1, int64_t{1} << 20);
    } else if (arg == "--iterations") {
      f.iterations = static_cast<int>(ParseInt(arg, value, 1, 1000));
    } else if (arg == "--queue-ahead") {
      f.queue_ahead = ParseInt(arg, value, 0, 1 << 20);
    } else if (arg == "--copy-path") {
      const std::string v = value;
      if (v != CopyPathName(CopyPath::kDma) && v != CopyPathName(CopyPath::kZeroCopy)) {
        BadFlag("--copy-path must be dma or zero_copy, not '" + v + "'");
      }
      f.copy_path = v == CopyPathName(CopyPath::kDma) ? CopyPath::kDma : CopyPath::kZeroCopy;
    } else {
      BadFlag("unknown flag: " + arg);
    }
  }
  if (f.chunk_tokens % kBlockTokens != 0) {
    BadFlag("--chunk-tokens must be a positive multiple of 16 (the cache's block size)");
  }
  if (f.cached_tokens % f.chunk_tokens != 0 || f.cached_tokens >= f.prompt_tokens) {
    BadFlag("--cached-tokens must be a positive multiple of --chunk-tokens (" +
            std::to_string(f.chunk_tokens) + ") and below --prompt-tokens (" +
            std::to_string(f.prompt_tokens) + ")");
  }
  return f;
}

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// The prefix KV as chunk payloads (layer-major, DESIGN.md "chunk payload") in one
// page-aligned host buffer registered with the runtime: what kvtierd's DRAM arena holds,
// without the daemon. Loads scatter the payloads into a cache through its block table.
// REQUIRES: the runtime, the layout and the caches passed in outlive it.
// Thread-safety: not thread-safe.
class PinnedHostKvSource final : public KvSource {
 public:
  // Errors: kOutOfMemory (host allocation or page-locking), kInvalidArgument, kDeviceError.
  static GpuStatus Create(Runtime& runtime, const KvLayout& layout, int64_t num_layers,
                          int64_t chunk_tokens, int64_t num_chunks, CopyPath path,
                          int64_t queue_ahead, std::unique_ptr<PinnedHostKvSource>* out) {
    std::unique_ptr<PinnedHostKvSource> s(
        new PinnedHostKvSource(runtime, layout, num_layers, chunk_tokens, path, queue_ahead));
    const size_t payload = layout.LayerPayloadBytes(chunk_tokens) * num_layers;
    const size_t bytes = (payload * num_chunks + 4095) / 4096 * 4096;
    s->buffer_.reset(static_cast<uint8_t*>(std::aligned_alloc(4096, bytes)));
    if (!s->buffer_) return GpuStatus::OutOfMemory("allocating the host KV buffer");
    for (int64_t c = 0; c < num_chunks; ++c) s->payloads_.push_back(s->buffer_.get() + c * payload);
    if (GpuStatus st = runtime.RegisterHost(s->buffer_.get(), bytes, PinOptions(), &s->pinned_);
        !st.ok()) {
      return st;
    }
    *out = std::move(s);
    return GpuStatus::Ok();
  }

  // The chunk set of the prefix over a cache's block table: chunk c holds tokens
  // [c * chunk_tokens, (c + 1) * chunk_tokens), in blocks block_table[c * bpc .. + bpc).
  KvChunkSet Chunks(const std::vector<int32_t>& block_table) const {
    const int64_t blocks =
        static_cast<int64_t>(payloads_.size()) * chunk_tokens_ / layout_.block_size_tokens();
    return KvChunkSet{
        &layout_,      num_layers_,
        chunk_tokens_, &pinned_,
        payloads_,     std::vector<int32_t>(block_table.begin(), block_table.begin() + blocks)};
  }

  // Device buffers come from one cache, as a real engine's GpuArena lends them: no load
  // frees device memory (cudaFree would synchronize the device inside the timed runs).
  KvTransferOptions TransferOptions() {
    KvTransferOptions options;
    options.scratch = &scratch_;
    options.path = path_;
    options.queue_ahead_layers = queue_ahead_;
    return options;
  }

  // Queues storing the prefix of `cache` into the buffer as the engine writes each layer.
  GpuStatus StartStore(const PagedCache& cache, Stream& store_stream,
                       std::unique_ptr<LayerwiseStore>* out) {
    return LayerwiseStore::Create(runtime_, Chunks(cache.block_table), cache.layer_tensors,
                                  TransferOptions(), store_stream, out);
  }

  GpuStatus StartLoad(PagedCache& cache, Stream& load_stream) override {
    if (load_) return GpuStatus::InvalidArgument("a load is in progress");
    std::unique_ptr<LayerwiseLoad> load;
    if (GpuStatus s =
            LayerwiseLoad::Create(runtime_, Chunks(cache.block_table), cache.layer_tensors,
                                  TransferOptions(), load_stream, &load);
        !s.ok()) {
      return s;
    }
    if (GpuStatus s = load->Start(); !s.ok()) return s;
    load_ = std::move(load);
    return GpuStatus::Ok();
  }

  GpuStatus WaitLayer(int64_t layer, Stream& compute_stream) override {
    if (!load_) return GpuStatus::InvalidArgument("no load started");
    return load_->WaitLayer(layer, compute_stream);
  }

  GpuStatus FinishLoad() override {
    if (!load_) return GpuStatus::InvalidArgument("no load started");
    KvCopyReport report;
    const GpuStatus s = load_->Finish(&report);
    load_.reset();
    if (!s.ok()) return s;
    if (!report.failed_chunks.empty()) {
      return GpuStatus::DeviceError(std::to_string(report.FailedBlockIds().size()) +
                                    " blocks failed to load");
    }
    return GpuStatus::Ok();
  }

 private:
  PinnedHostKvSource(Runtime& runtime, const KvLayout& layout, int64_t num_layers,
                     int64_t chunk_tokens, CopyPath path, int64_t queue_ahead)
      : runtime_(runtime),
        layout_(layout),
        num_layers_(num_layers),
        chunk_tokens_(chunk_tokens),
        path_(path),
        queue_ahead_(queue_ahead) {}

  Runtime& runtime_;
  BufferCache scratch_{runtime_};  // declared before load_: outlives what it lends
  const KvLayout& layout_;
  const int64_t num_layers_;
  const int64_t chunk_tokens_;
  const CopyPath path_;
  const int64_t queue_ahead_;
  std::unique_ptr<uint8_t, FreeDeleter> buffer_;  // declared before pinned_: outlives it
  PinnedRange pinned_;
  std::vector<void*> payloads_;
  std::unique_ptr<LayerwiseLoad> load_;  // the load in progress
};

int Main(int argc, char** argv) {
  const Flags flags = ParseFlags(argc, argv);
  ModelShape shape;
  if (GpuStatus s = ModelShape::Preset(flags.model, &shape); !s.ok()) BadFlag(s.message());

  std::unique_ptr<Runtime> runtime;
  if (flags.backend == "host") {
    runtime = Runtime::CreateHost();
  } else if (GpuStatus s = Runtime::CreateCuda(flags.device, &runtime); !s.ok()) {
    std::fprintf(stderr, "kvtier-engine-standalone: no CUDA backend: %s\n", s.ToString().c_str());
    return 2;
  }
  Runtime& rt = *runtime;
  Stream compute, load, store;
  for (Stream* s : {&compute, &load, &store}) Check(rt.CreateStream(s), "stream");

  const std::vector<int32_t> prompt = MakePrompt(flags.prompt_tokens);
  std::unique_ptr<Engine> engine;
  Check(Engine::Create(rt, shape, prompt, compute, &engine), "engine");
  PagedCache stored_cache, serve_cache;  // A: prefill + store; B: the three ways of serving
  Check(engine->CreateCache(1, &stored_cache), "cache A");
  Check(engine->CreateCache(2, &serve_cache), "cache B");
  const int64_t num_chunks = flags.cached_tokens / flags.chunk_tokens;
  std::unique_ptr<PinnedHostKvSource> source;
  Check(PinnedHostKvSource::Create(rt, stored_cache.layout, shape.num_layers, flags.chunk_tokens,
                                   num_chunks, flags.copy_path, flags.queue_ahead, &source),
        "pinned host KV buffer");

  // 1. Prefill the whole prompt into cache A, storing the prefix chunks layer by layer.
  Clock::time_point t0 = Clock::now();
  {
    std::unique_ptr<LayerwiseStore> storer;
    Check(source->StartStore(stored_cache, store, &storer), "store start");
    LayerHooks hooks;
    hooks.after_kv_append = [&](int64_t l) { return storer->LayerWritten(l, compute); };
    Check(engine->Forward(stored_cache, 0, flags.prompt_tokens, compute, hooks), "prefill");
    Check(rt.Synchronize(compute), "prefill");
    KvCopyReport report;
    Check(storer->Finish(&report), "store finish");
    if (!report.failed_chunks.empty()) {
      Die(std::to_string(report.failed_chunks.size()) + " of " + std::to_string(num_chunks) +
          " chunks failed to store");
    }
  }
  const double prefill_store_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - t0).count();

  // 2. The three ways, from the pinned host buffer.
  TtftOptions options;
  options.prompt_tokens = flags.prompt_tokens;
  options.cached_tokens = flags.cached_tokens;
  options.iterations = flags.iterations;
  TtftReport report;
  TtftBench bench(rt, *engine, compute, load);
  Check(bench.Run(stored_cache, serve_cache, *source, options, &report), "TTFT runs");

  std::printf(
      "kvtier-engine-standalone: %s (%lld layers, %lld/%lld heads, head_dim %lld, "
      "hidden %lld), fp16, on %s, KV source: pinned host buffer (no daemon), copy path %s, queue "
      "ahead %lld\n",
      shape.name.c_str(), static_cast<long long>(shape.num_layers),
      static_cast<long long>(shape.num_q_heads), static_cast<long long>(shape.num_kv_heads),
      static_cast<long long>(shape.head_dim), static_cast<long long>(shape.hidden),
      std::string(rt.name()).c_str(), std::string(CopyPathName(flags.copy_path)).c_str(),
      static_cast<long long>(flags.queue_ahead));
  std::printf(
      "prompt %lld tokens, cached prefix %lld tokens (%lld chunks, %.1f MiB of KV), "
      "%d iterations, medians\n",
      static_cast<long long>(flags.prompt_tokens), static_cast<long long>(flags.cached_tokens),
      static_cast<long long>(num_chunks), static_cast<double>(report.prefix_kv_bytes) / 1048576.0,
      flags.iterations);
  std::printf("prefill + layerwise store:              %10.2f ms (%lld chunks stored)\n",
              prefill_store_ms, static_cast<long long>(num_chunks));
  report.Print(stdout);
  return report.verified() ? 0 : 1;
}

}  // namespace
}  // namespace kvtier::gpu::engine

int main(int argc, char** argv) { return kvtier::gpu::engine::Main(argc, argv); }
