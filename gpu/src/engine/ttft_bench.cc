#include "kvtier/gpu/engine/ttft_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>

#include "status_context.h"

namespace kvtier::gpu::engine {
namespace {

using Clock = std::chrono::steady_clock;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

float MaxAbsDiff(const std::vector<float>& x, const std::vector<float>& y) {
  float m = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    const float d = std::fabs(x[i] - y[i]);
    if (!(d <= m)) m = d;  // NaN propagates
  }
  return m;
}

}  // namespace

GpuStatus TtftOptions::Validate() const {
  if (prompt_tokens <= 0) return GpuStatus::InvalidArgument("prompt_tokens must be positive");
  if (cached_tokens <= 0 || cached_tokens >= prompt_tokens) {
    return GpuStatus::InvalidArgument("cached_tokens must be in [1, prompt_tokens)");
  }
  if (iterations < 1) return GpuStatus::InvalidArgument("iterations must be at least 1");
  return GpuStatus::Ok();
}

void TtftReport::Print(std::FILE* out) const {
  const double a = ttft_recompute_ms;
  std::fprintf(out, "TTFT (a) recompute everything:          %10.2f ms\n", a);
  std::fprintf(out, "TTFT (b) load prefix, then compute:     %10.2f ms (%.2fx of a)\n",
               ttft_load_then_compute_ms, ttft_load_then_compute_ms / a);
  std::fprintf(out, "TTFT (c) layerwise load + compute:      %10.2f ms (%.2fx of a)\n",
               ttft_layerwise_ms, ttft_layerwise_ms / a);
  std::fprintf(out, "  of which StartLoad (host, before compute): %6.2f ms\n",
               layerwise_start_median_ms);
  std::fprintf(out, "load only:                              %10.2f ms (%.2f GB/s)\n", load_ms,
               load_gb_per_s);
  std::fprintf(out, "compute only (%lld new tokens):        %10.2f ms\n",
               static_cast<long long>(new_tokens), compute_ms);
  std::fprintf(out,
               "overlap ratio (c) / max(load, compute): %10.3f (1 = full overlap, %.3f = none)\n",
               overlap_ratio, no_overlap_ratio);
  std::fprintf(out,
               "recompute %.3f TFLOP/s vs plain GEMMs of the same shapes %.3f TFLOP/s: "
               "ratio %.3f\n",
               recompute_tflops, plain_gemm_tflops, recompute_vs_gemm_ratio);
  if (on_cuda && recompute_vs_gemm_ratio < 0.5) {
    std::fprintf(out,
                 "WARNING: recompute reaches under half the plain GEMM rate; the recompute "
                 "baseline is too slow for an honest comparison\n");
  }
  std::fprintf(out,
               "verify: %s: %llu bytes of loaded KV compared with the stored KV, %llu rows "
               "differ (control before loading: %llu rows differ)\n",
               verified() ? "OK" : "FAILED", static_cast<unsigned long long>(verified_bytes),
               static_cast<unsigned long long>(differing_rows),
               static_cast<unsigned long long>(control_differing_rows));
  std::fprintf(out, "first-token logits, max |diff| vs recompute: (b) %g, (c) %g\n",
               logits_diff_load_then_compute, logits_diff_layerwise);
}

GpuStatus TtftBench::ComparePrefix(const PagedCache& a, const PagedCache& b, int64_t tokens,
                                   uint64_t* compared_bytes, uint64_t* differing_rows) {
  const size_t bytes = a.layout.tensor_span_bytes(0);
  std::vector<unsigned char> ha(bytes), hb(bytes);
  const auto row = static_cast<size_t>(a.token_row_bytes());
  for (size_t l = 0; l < a.layers.size(); ++l) {
    KVTIER_ENGINE_RETURN_IF_ERROR(internal::WithContext(
        runtime_.CopyAsync(ha.data(), a.layers[l].data(), bytes, compute_), "reading cache A"));
    KVTIER_ENGINE_RETURN_IF_ERROR(internal::WithContext(
        runtime_.CopyAsync(hb.data(), b.layers[l].data(), bytes, compute_), "reading cache B"));
    KVTIER_ENGINE_RETURN_IF_ERROR(
        internal::WithContext(runtime_.Synchronize(compute_), "reading caches"));
    for (int plane = 0; plane < 2; ++plane) {
      for (int64_t pos = 0; pos < tokens; ++pos) {
        if (std::memcmp(ha.data() + a.RowOffsetBytes(plane, pos),
                        hb.data() + b.RowOffsetBytes(plane, pos), row) != 0) {
          ++*differing_rows;
        }
        *compared_bytes += row;
      }
    }
  }
  return GpuStatus::Ok();
}

GpuStatus TtftBench::Run(const PagedCache& reference, PagedCache& serve, KvSource& source,
                         const TtftOptions& options, TtftReport* out) {
  if (out == nullptr) return GpuStatus::InvalidArgument("TtftBench::Run: null out");
  KVTIER_ENGINE_RETURN_IF_ERROR(options.Validate());
  if (options.prompt_tokens > engine_.max_tokens()) {
    return GpuStatus::InvalidArgument("prompt_tokens is above the engine's max_tokens");
  }
  const int64_t prompt = options.prompt_tokens, cached = options.cached_tokens;
  const int64_t fresh = prompt - cached;
  TtftReport r;
  r.prompt_tokens = prompt;
  r.cached_tokens = cached;
  r.new_tokens = fresh;
  r.iterations = options.iterations;
  r.prefix_kv_bytes = static_cast<uint64_t>(cached * engine_.shape().KvBytesPerToken());
  r.on_cuda = runtime_.backend() == Backend::kCuda;

  auto sync = [&](Stream& s, const char* what) {
    return internal::WithContext(runtime_.Synchronize(s), what);
  };
  auto clear_serve = [&]() -> GpuStatus {
    KVTIER_ENGINE_RETURN_IF_ERROR(
        internal::WithContext(engine_.ClearCache(serve, compute_), "clear"));
    return sync(compute_, "clear");
  };
  auto verify = [&] {
    return ComparePrefix(reference, serve, cached, &r.verified_bytes, &r.differing_rows);
  };

  // Negative control: a cleared serving cache must differ from the reference, or the
  // bit-exact check below could not fail.
  KVTIER_ENGINE_RETURN_IF_ERROR(clear_serve());
  uint64_t control_bytes = 0;
  KVTIER_ENGINE_RETURN_IF_ERROR(
      ComparePrefix(reference, serve, cached, &control_bytes, &r.control_differing_rows));
  if (r.control_differing_rows == 0) {
    return GpuStatus::InvalidArgument("the stored KV is all zeros: the check would be vacuous");
  }

  std::vector<float> logits_a, logits_b, logits_c;
  Clock::time_point t0;
  for (int it = 0; it < options.iterations; ++it) {
    // (a) recompute everything.
    t0 = Clock::now();
    KVTIER_ENGINE_RETURN_IF_ERROR(
        internal::WithContext(engine_.Forward(serve, 0, prompt, compute_), "recompute"));
    KVTIER_ENGINE_RETURN_IF_ERROR(sync(compute_, "recompute"));
    r.recompute_ms.push_back(Ms(Clock::now() - t0));
    KVTIER_ENGINE_RETURN_IF_ERROR(
        internal::WithContext(engine_.ReadLogits(compute_, &logits_a), "logits"));

    // The GEMM baseline: the recompute's GEMMs alone.
    t0 = Clock::now();
    KVTIER_ENGINE_RETURN_IF_ERROR(
        internal::WithContext(engine_.PlainGemms(prompt, compute_), "plain GEMMs"));
    KVTIER_ENGINE_RETURN_IF_ERROR(sync(compute_, "plain GEMMs"));
    r.plain_gemm_ms.push_back(Ms(Clock::now() - t0));

    // Load only.
    KVTIER_ENGINE_RETURN_IF_ERROR(clear_serve());
    t0 = Clock::now();
    KVTIER_ENGINE_RETURN_IF_ERROR(internal::WithContext(source.StartLoad(serve, load_), "load"));
    KVTIER_ENGINE_RETURN_IF_ERROR(internal::WithContext(source.FinishLoad(), "load finish"));
    r.load_only_ms.push_back(Ms(Clock::now() - t0));
    KVTIER_ENGINE_RETURN_IF_ERROR(verify());

    // Compute only: the new tokens over the (loaded) prefix.
    t0 = Clock::now();
    KVTIER_ENGINE_RETURN_IF_ERROR(
        internal::WithContext(engine_.Forward(serve, cached, fresh, compute_), "compute"));
    KVTIER_ENGINE_RETURN_IF_ERROR(sync(compute_, "compute"));
    r.compute_only_ms.push_back(Ms(Clock::now() - t0));

    // (b) load every layer, then compute.
    KVTIER_ENGINE_RETURN_IF_ERROR(clear_serve());
    t0 = Clock::now();
    KVTIER_ENGINE_RETURN_IF_ERROR(
        internal::WithContext(source.StartLoad(serve, load_), "load (b)"));
    KVTIER_ENGINE_RETURN_IF_ERROR(internal::WithContext(source.FinishLoad(), "load finish (b)"));
    KVTIER_ENGINE_RETURN_IF_ERROR(
        internal::WithContext(engine_.Forward(serve, cached, fresh, compute_), "compute (b)"));
    KVTIER_ENGINE_RETURN_IF_ERROR(sync(compute_, "compute (b)"));
    r.load_then_compute_ms.push_back(Ms(Clock::now() - t0));
    KVTIER_ENGINE_RETURN_IF_ERROR(
        internal::WithContext(engine_.ReadLogits(compute_, &logits_b), "logits"));
    KVTIER_ENGINE_RETURN_IF_ERROR(verify());

    // (c) layerwise: layer i+1 loads while layer i computes.
    KVTIER_ENGINE_RETURN_IF_ERROR(clear_serve());
    t0 = Clock::now();
    KVTIER_ENGINE_RETURN_IF_ERROR(
        internal::WithContext(source.StartLoad(serve, load_), "load (c)"));
    r.layerwise_start_ms.push_back(Ms(Clock::now() - t0));
    LayerHooks hooks;
    hooks.before_attention = [&](int64_t l) { return source.WaitLayer(l, compute_); };
    KVTIER_ENGINE_RETURN_IF_ERROR(internal::WithContext(
        engine_.Forward(serve, cached, fresh, compute_, hooks), "compute (c)"));
    KVTIER_ENGINE_RETURN_IF_ERROR(sync(compute_, "compute (c)"));
    KVTIER_ENGINE_RETURN_IF_ERROR(internal::WithContext(source.FinishLoad(), "load finish (c)"));
    r.layerwise_ms.push_back(Ms(Clock::now() - t0));
    KVTIER_ENGINE_RETURN_IF_ERROR(
        internal::WithContext(engine_.ReadLogits(compute_, &logits_c), "logits"));
    KVTIER_ENGINE_RETURN_IF_ERROR(verify());
    r.logits_diff_load_then_compute =
        std::max(r.logits_diff_load_then_compute, MaxAbsDiff(logits_a, logits_b));
    r.logits_diff_layerwise = std::max(r.logits_diff_layerwise, MaxAbsDiff(logits_a, logits_c));
  }

  r.ttft_recompute_ms = Median(r.recompute_ms);
  r.ttft_load_then_compute_ms = Median(r.load_then_compute_ms);
  r.ttft_layerwise_ms = Median(r.layerwise_ms);
  r.layerwise_start_median_ms = Median(r.layerwise_start_ms);
  r.load_ms = Median(r.load_only_ms);
  r.compute_ms = Median(r.compute_only_ms);
  r.plain_gemm_median_ms = Median(r.plain_gemm_ms);
  const double slower = std::max(r.load_ms, r.compute_ms);
  r.overlap_ratio = r.ttft_layerwise_ms / slower;
  r.no_overlap_ratio = (r.load_ms + r.compute_ms) / slower;
  r.load_gb_per_s = static_cast<double>(r.prefix_kv_bytes) / (r.load_ms * 1e6);
  r.recompute_tflops = engine_.ForwardFlops(0, prompt) / (r.ttft_recompute_ms * 1e9);
  r.plain_gemm_tflops = engine_.PlainGemmFlops(prompt) / (r.plain_gemm_median_ms * 1e9);
  r.recompute_vs_gemm_ratio = r.recompute_tflops / r.plain_gemm_tflops;
  *out = std::move(r);
  return GpuStatus::Ok();
}

}  // namespace kvtier::gpu::engine
