// TtftBench: serves one prompt three ways on the test engine and measures the time to first
// token (TTFT) of each, with the cached prefix coming from a KvSource:
//
//   (a) recompute: prefill every prompt token.
//   (b) load, then compute: load the cached prefix, wait for every layer, then compute the
//       new tokens.
//   (c) layerwise: queue every layer's load, and before each layer's attention make the
//       compute stream wait for that layer only (KvSource::WaitLayer), so layer i+1 loads
//       while layer i computes.
//
// Every load goes into a cleared serving cache and is compared bit for bit with a reference
// cache holding the prefix KV (the one the source was filled from). Baselines measured in
// the same run: load-only and compute-only times (overlap ratio of (c) = wall / max(load,
// compute)), and a plain GEMM run of exactly the recompute's GEMM shapes (recompute TFLOP/s
// / plain GEMM TFLOP/s).
#pragma once

#include <cstdint>
#include <cstdio>
#include <vector>

#include "kvtier/gpu/engine/engine.h"
#include "kvtier/gpu/engine/kv_source.h"
#include "kvtier/gpu/gpu_status.h"
#include "kvtier/gpu/runtime.h"
#include "kvtier/gpu/stream.h"

namespace kvtier::gpu::engine {

struct TtftOptions {
  // Tokens of the prompt served; <= the engine's max_tokens. Required (> 0).
  int64_t prompt_tokens = 0;
  // Tokens of the cached prefix the source loads; 0 < cached_tokens < prompt_tokens.
  // Required.
  int64_t cached_tokens = 0;
  // Runs of each scenario; medians are reported. Default: 3.
  int iterations = 3;

  // Errors: kInvalidArgument naming the field.
  GpuStatus Validate() const;
};

// What one TtftBench::Run measured. Times in milliseconds of wall clock on the host, from
// queueing the first work to the end of a stream synchronize.
struct TtftReport {
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
  int64_t new_tokens = 0;  // prompt_tokens - cached_tokens
  int iterations = 0;
  uint64_t prefix_kv_bytes = 0;  // K and V of every layer of the cached prefix
  bool on_cuda = false;

  // Per iteration, in run order.
  std::vector<double> recompute_ms, load_then_compute_ms, layerwise_ms, load_only_ms,
      compute_only_ms, plain_gemm_ms;
  // (c)'s host time in KvSource::StartLoad, before the first compute launch.
  std::vector<double> layerwise_start_ms;

  // Medians of the runs above.
  double ttft_recompute_ms = 0, ttft_load_then_compute_ms = 0, ttft_layerwise_ms = 0;
  double load_ms = 0, compute_ms = 0, plain_gemm_median_ms = 0, layerwise_start_median_ms = 0;
  // ttft_layerwise_ms / max(load_ms, compute_ms): 1 = full overlap.
  double overlap_ratio = 0;
  // (load_ms + compute_ms) / max(load_ms, compute_ms): the ratio with no overlap at all.
  double no_overlap_ratio = 0;
  double load_gb_per_s = 0;  // prefix_kv_bytes / load_ms
  double recompute_tflops = 0, plain_gemm_tflops = 0;
  double recompute_vs_gemm_ratio = 0;  // recompute_tflops / plain_gemm_tflops

  // Bit-exact check of every load: bytes compared, (layer, plane, position) rows that
  // differed, and rows that differed before the first load (> 0, or Run fails: the check
  // could not fail).
  uint64_t verified_bytes = 0, differing_rows = 0, control_differing_rows = 0;
  // Max |logit difference| of the first output token vs the recompute, over iterations.
  float logits_diff_load_then_compute = 0, logits_diff_layerwise = 0;

  bool verified() const { return differing_rows == 0 && verified_bytes > 0; }

  // Prints the figures, one per line: the three TTFTs, load only, compute only, overlap
  // ratio, recompute vs plain GEMM TFLOP/s, verify and logits.
  void Print(std::FILE* out) const;
};

// Thread-safety: not thread-safe. REQUIRES: the runtime, engine and streams outlive it.
class TtftBench {
 public:
  TtftBench(Runtime& runtime, Engine& engine, Stream& compute_stream, Stream& load_stream)
      : runtime_(runtime), engine_(engine), compute_(compute_stream), load_(load_stream) {}

  // Runs options.iterations of: (a), the plain GEMM baseline, load only, compute only, (b),
  // (c); each load goes into `serve` after clearing it and is compared with `reference`
  // over the prefix. Sets *out even when loaded bytes differ (see TtftReport::verified).
  // REQUIRES: `reference` holds the prefix KV the source loads; both caches come from
  // this engine's CreateCache. Errors: kInvalidArgument (bad options, null out, a
  // reference that equals a cleared cache over the prefix), a source's or the engine's
  // status (with what failed before its message).
  GpuStatus Run(const PagedCache& reference, PagedCache& serve, KvSource& source,
                const TtftOptions& options, TtftReport* out);

 private:
  // Byte-compares K and V of positions [0, tokens) of every layer of two caches (each
  // through its own block table), adding to *compared_bytes and *differing_rows.
  GpuStatus ComparePrefix(const PagedCache& a, const PagedCache& b, int64_t tokens,
                          uint64_t* compared_bytes, uint64_t* differing_rows);

  Runtime& runtime_;
  Engine& engine_;
  Stream& compute_;
  Stream& load_;
};

}  // namespace kvtier::gpu::engine
