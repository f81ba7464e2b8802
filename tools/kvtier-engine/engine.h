// Engine: a minimal transformer forward pass on a gpu::Runtime with a real paged KV cache
// (vLLM flash-attn layout, one tensor [2, num_blocks, block_size, kv_heads, head_dim] per
// layer), for measuring what loading cached KV saves against recomputing it.
//
// Per layer, for n new tokens at positions [first, first + n):
//   qkv  = x W_qkv^T                  GEMM [n, hidden] x [qkv_dim, hidden]^T
//   append K, V of qkv into the cache (LaunchKvAppend)       -> hooks.after_kv_append
//                                                            -> hooks.before_attention
//   attn = causal attention of q over cache positions [0, first + n)
//   o    = attn W_o^T                 GEMM [n, q_heads * head_dim] x [hidden, ...]^T
//   gu   = o W_gate_up^T              GEMM [n, hidden] x [2 * intermediate, hidden]^T
//   x   += gu[:, :intermediate] W_down^T   GEMM [n, intermediate] x [hidden, ...]^T (residual)
// then the LM head for the last token (logits, [vocab]).
//
// The residual stream x starts as the prompt's embeddings (uniform in +-1). What it leaves
// out, and why that does not change the cost materially: RMSNorm, RoPE, SiLU and the
// attention residual (elementwise; well under 1% of a layer's FLOPs and bytes at these
// shapes), and distinct weights per layer (one weight set serves every layer; each matrix is
// far larger than the GPU's L2, so reuse across layers does not make the GEMMs cheaper).
// Without norms, weights are uniform with variance 1 / in_features (W_down: 1 / (8 *
// in_features)), so the residual stream grows slowly and stays finite in fp16.
//
// Thread-safety: not thread-safe; one thread queues work, on the streams it passes in.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "kvtier/gpu/compute.h"
#include "kvtier/gpu/kv_layout.h"
#include "kvtier/gpu/runtime.h"
#include "kvtier/layerwise.h"
#include "kvtier/status.h"
#include "model_shape.h"

namespace kvtier::engine {

// Tokens per cache block (vLLM's default block_size).
inline constexpr int64_t kBlockTokens = 16;

// One sequence's paged KV cache: every layer's tensor, and the sequence's block table (a
// shuffled permutation of the blocks, as an allocator hands them out).
struct PagedCache {
  gpu::KvLayout layout;
  std::vector<gpu::DeviceBuffer> layers;  // [num_layers], each layout.tensor_span_bytes(0)
  std::vector<int32_t> block_table;       // host copy
  gpu::DeviceBuffer block_table_device;
  PagedKvCache desc;  // for LayerwiseLoader/LayerwiseStorer

  // Bytes of one token of one plane (K or V) of one layer: kv_heads * head_dim * 2.
  int64_t token_row_bytes() const { return layout.heads() * layout.head_dim() * 2; }
  // Byte offset of (plane, position) in a layer tensor (flash-attn: the head rows of one
  // token are contiguous).
  int64_t RowOffsetBytes(int plane, int64_t position) const;
};

// Called per layer from Forward; a non-OK status stops the forward and is returned.
struct LayerHooks {
  std::function<Status(int64_t layer)> after_kv_append;   // e.g. LayerwiseStorer::LayerDone
  std::function<Status(int64_t layer)> before_attention;  // e.g. LayerwiseLoader::WaitLayer
};

class Engine {
 public:
  // Allocates weights and activations for prompts of up to `max_tokens` tokens and uploads
  // the embeddings of `prompt` (its size <= max_tokens). Queues on `stream` and waits.
  // Errors: INVALID_ARGUMENT (empty or too long prompt), RESOURCE_EXHAUSTED (out of device
  // memory), UNAVAILABLE (other runtime errors).
  static Result<std::unique_ptr<Engine>> Create(gpu::Runtime& runtime, const ModelShape& shape,
                                                std::span<const int32_t> prompt,
                                                gpu::Stream& stream);

  // A paged cache with room for max_tokens, zero-filled, block table shuffled with `seed`.
  Status CreateCache(uint32_t seed, PagedCache* out);
  // Queues zeroing every layer tensor of `cache`.
  Status ClearCache(PagedCache& cache, gpu::Stream& stream);

  // Queues the forward pass of prompt tokens [first, first + n) on `stream`; the cache must
  // hold (or, through hooks, come to hold) positions [0, first). The first output token's
  // logits land in logits(). Errors: INVALID_ARGUMENT (range outside the prompt), a hook's
  // status, UNAVAILABLE (a launch the runtime refused).
  Status Forward(PagedCache& cache, int64_t first, int64_t n, gpu::Stream& stream,
                 const LayerHooks& hooks = {});
  // Floating-point operations of Forward(first, n): GEMMs, causal attention, LM head.
  double ForwardFlops(int64_t first, int64_t n) const;

  // Queues exactly Forward's GEMMs for n tokens (same shapes, same count, LM head included),
  // without the KV append and attention: the GEMM baseline measured in the same run.
  Status PlainGemms(int64_t n, gpu::Stream& stream);
  double PlainGemmFlops(int64_t n) const;

  // Copies the logits of the last Forward to the host (synchronizes `stream`).
  Status ReadLogits(gpu::Stream& stream, std::vector<float>* out);

  const ModelShape& shape() const { return shape_; }
  int64_t max_tokens() const { return max_tokens_; }

 private:
  Engine(gpu::Runtime& runtime, const ModelShape& shape, int64_t max_tokens)
      : runtime_(runtime), shape_(shape), max_tokens_(max_tokens) {}
  Status Allocate(std::span<const int32_t> prompt, gpu::Stream& stream);
  Status Gemm(const void* a, int64_t lda, const gpu::DeviceBuffer& w, int64_t n, int64_t k,
              void* c, int64_t m, gpu::Stream& stream, bool accumulate = false);
  // The GEMMs of one layer after attention (O, gate+up, down), reading attn_, writing x_.
  Status MlpAndOutput(int64_t n, gpu::Stream& stream);

  gpu::Runtime& runtime_;
  const ModelShape shape_;
  const int64_t max_tokens_;
  gpu::DeviceBuffer w_qkv_, w_o_, w_gate_up_, w_down_, w_lm_;  // [out, in] fp16
  gpu::DeviceBuffer embeddings_;  // [max_tokens, hidden]: the prompt's input rows
  gpu::DeviceBuffer x_;           // [max_tokens, hidden]: layer output / next layer input
  gpu::DeviceBuffer qkv_;         // [max_tokens, qkv_dim]
  gpu::DeviceBuffer attn_;        // [max_tokens, q_heads * head_dim]
  gpu::DeviceBuffer o_;           // [max_tokens, hidden]
  gpu::DeviceBuffer gate_up_;     // [max_tokens, 2 * intermediate]
  gpu::DeviceBuffer logits_;      // [vocab]
  gpu::DeviceBuffer workspace_;   // attention scratch for a full-prompt prefill
};

// fp16 bits of k * 2^-shift for |k| < 2048 and 0 <= shift <= 24 (exact, no rounding).
uint16_t ExactHalf(int32_t k, int shift);
// The value of fp16 bits.
float HalfToFloat(uint16_t bits);

}  // namespace kvtier::engine
