// Engine: the test engine's core (tools/kvtier-engine against kvtierd, and
// gpu/tools/engine_standalone.cc), a minimal transformer forward pass on a Runtime with a
// real paged KV cache (vLLM flash-attn layout, one tensor [2, num_blocks, block_size,
// kv_heads, head_dim] per layer), for measuring what loading cached KV saves against recomputing
// it.
//
// Per layer, for n new tokens at positions [first, first + n):
//   qkv  = x W_qkv^T                  GEMM [n, hidden] x [qkv_dim, hidden]^T
//   append K, V of qkv into the cache (Compute::LaunchKvAppend) -> hooks.after_kv_append
//                                                              -> hooks.before_attention
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

#include "kvtier/gpu/device_buffer.h"
#include "kvtier/gpu/engine/compute.h"
#include "kvtier/gpu/engine/model_shape.h"
#include "kvtier/gpu/gpu_status.h"
#include "kvtier/gpu/kv_copy.h"
#include "kvtier/gpu/kv_layout.h"
#include "kvtier/gpu/runtime.h"
#include "kvtier/gpu/stream.h"

namespace kvtier::gpu::engine {

// Tokens per cache block (vLLM's default block_size).
inline constexpr int64_t kBlockTokens = 16;

// One sequence's paged KV cache: every layer's tensor, and the sequence's block table (a
// shuffled permutation of the blocks, as an allocator hands them out).
// Thread-safety: a value; the engine queues work that writes its tensors.
struct PagedCache {
  KvLayoutSpec spec;                 // VllmFlashAttn(blocks, kBlockTokens, kv_heads, head_dim, 2)
  KvLayout layout;                   // validated `spec`
  std::vector<DeviceBuffer> layers;  // [num_layers], each layout.tensor_span_bytes(0)
  // [num_layers]: tensors[0] = layers[l].data() (for LayerwiseLoad/Store and the client's
  // LayerwiseLoader/Storer).
  std::vector<LayerTensors> layer_tensors;
  std::vector<int32_t> block_table;  // host copy: block_table[j] holds tokens [16j, 16j + 16)
  DeviceBuffer block_table_device;

  // Bytes of one token of one plane (K or V) of one layer: kv_heads * head_dim * 2.
  int64_t token_row_bytes() const { return layout.heads() * layout.head_dim() * 2; }
  // Byte offset of (plane, position) in a layer tensor (flash-attn: the head rows of one
  // token are contiguous).
  int64_t RowOffsetBytes(int plane, int64_t position) const;
};

// Called per layer from Forward; a non-OK status stops the forward and is returned.
struct LayerHooks {
  // e.g. LayerwiseStore::LayerWritten, LayerwiseStorer::LayerDone
  std::function<GpuStatus(int64_t layer)> after_kv_append;
  // e.g. LayerwiseLoad::WaitLayer, LayerwiseLoader::WaitLayer
  std::function<GpuStatus(int64_t layer)> before_attention;
};

class Engine {
 public:
  // Allocates weights and activations for prompts of up to prompt.size() tokens, uploads
  // the embeddings of `prompt` and sets *out. Queues on `stream` and waits. REQUIRES: the
  // runtime outlives the engine. Errors: kInvalidArgument (empty prompt, null out),
  // kOutOfMemory (device memory), kDeviceError (other runtime errors).
  static GpuStatus Create(Runtime& runtime, const ModelShape& shape,
                          std::span<const int32_t> prompt, Stream& stream,
                          std::unique_ptr<Engine>* out);

  // A paged cache with room for max_tokens, zero-filled, block table shuffled with `seed`.
  // Errors: kOutOfMemory, kDeviceError.
  GpuStatus CreateCache(uint32_t seed, PagedCache* out);
  // Queues zeroing every layer tensor of `cache`. Errors: kDeviceError.
  GpuStatus ClearCache(PagedCache& cache, Stream& stream);

  // Queues the forward pass of prompt tokens [first, first + n) on `stream`; the cache must
  // hold (or, through hooks, come to hold) positions [0, first). The first output token's
  // logits are read by ReadLogits. Errors: kInvalidArgument (range outside the prompt), a
  // hook's status, kDeviceError (a launch the runtime refused).
  GpuStatus Forward(PagedCache& cache, int64_t first, int64_t n, Stream& stream,
                    const LayerHooks& hooks = {});
  // Floating-point operations of Forward(first, n): GEMMs, causal attention, LM head.
  double ForwardFlops(int64_t first, int64_t n) const;

  // Queues exactly Forward's GEMMs for n tokens (same shapes, same count, LM head included),
  // without the KV append and attention: the GEMM baseline measured in the same run.
  // Errors: kInvalidArgument (n outside [1, max_tokens]), kDeviceError.
  GpuStatus PlainGemms(int64_t n, Stream& stream);
  double PlainGemmFlops(int64_t n) const;

  // Copies the logits of the last Forward ([vocab] floats) to the host (synchronizes
  // `stream`). Errors: kDeviceError.
  GpuStatus ReadLogits(Stream& stream, std::vector<float>* out);

  const ModelShape& shape() const { return shape_; }
  int64_t max_tokens() const { return max_tokens_; }

 private:
  Engine(Runtime& runtime, const ModelShape& shape, int64_t max_tokens)
      : runtime_(runtime), compute_(runtime), shape_(shape), max_tokens_(max_tokens) {}
  GpuStatus Allocate(std::span<const int32_t> prompt, Stream& stream);
  GpuStatus Gemm(const void* a, int64_t lda, const DeviceBuffer& w, int64_t n, int64_t k, void* c,
                 int64_t m, Stream& stream, bool accumulate = false);
  // The GEMMs of one layer after attention (O, gate+up, down), reading attn_, writing x_.
  GpuStatus MlpAndOutput(int64_t n, Stream& stream);

  Runtime& runtime_;
  Compute compute_;  // GEMMs, KV append and attention on runtime_
  const ModelShape shape_;
  const int64_t max_tokens_;
  DeviceBuffer w_qkv_, w_o_, w_gate_up_, w_down_, w_lm_;  // [out, in] fp16
  DeviceBuffer embeddings_;  // [max_tokens, hidden]: the prompt's input rows
  DeviceBuffer x_;           // [max_tokens, hidden]: layer output / next layer input
  DeviceBuffer qkv_;         // [max_tokens, qkv_dim]
  DeviceBuffer attn_;        // [max_tokens, q_heads * head_dim]
  DeviceBuffer o_;           // [max_tokens, hidden]
  DeviceBuffer gate_up_;     // [max_tokens, 2 * intermediate]
  DeviceBuffer logits_;      // [vocab]
  DeviceBuffer workspace_;   // attention scratch for a full-prompt prefill
};

// fp16 bits of k * 2^-shift for |k| < 2048 and 0 <= shift <= 24 (exact, no rounding).
uint16_t ExactHalf(int32_t k, int shift);
// The value of fp16 bits.
float HalfToFloat(uint16_t bits);

}  // namespace kvtier::gpu::engine
