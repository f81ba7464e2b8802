// The arguments of the compute operations a test engine needs on top of the copy runtime:
// a half-precision GEMM (Runtime::LaunchGemm), writing new tokens' K/V into a paged KV cache
// (Runtime::LaunchKvAppend, vLLM's reshape_and_cache) and causal attention of new tokens
// over a paged KV cache (Runtime::LaunchPagedAttention). One sequence per launch.
//
// Precision: inputs and outputs in fp16 or bf16, products accumulated in fp32. The backends
// agree to fp16/bf16 rounding, not bit for bit (cuBLAS picks its own summation order).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "kvtier/gpu/kv_copy.h"
#include "kvtier/gpu/kv_layout.h"

namespace kvtier::gpu {

// A 2-byte floating-point element type.
enum class ScalarType : uint8_t {
  kFloat16,   // IEEE 754 binary16.
  kBFloat16,  // bfloat16: the top 16 bits of an IEEE 754 binary32.
};

// "fp16" or "bf16".
std::string_view ScalarTypeName(ScalarType type);

// C = A * B^T, or C += A * B^T with `accumulate` (torch.nn.Linear: y = x W^T; accumulate
// adds a residual), row-major, with fp32 accumulation.
//   A: [m, k], row i at a + i * lda (elements).
//   B: [n, k], row j at b + j * ldb (the weight, out_features x in_features).
//   C: [m, n], row i at c + i * ldc; read only when accumulating (beta = 1, else 0).
// All three are device memory of the launching runtime, of element type `type`.
struct GemmArgs {
  ScalarType type = ScalarType::kFloat16;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  const void* a = nullptr;
  int64_t lda = 0;  // >= k. 0 means k (contiguous). Default: 0.
  const void* b = nullptr;
  int64_t ldb = 0;  // >= k. 0 means k. Default: 0.
  void* c = nullptr;
  int64_t ldc = 0;          // >= n. 0 means n. Default: 0.
  bool accumulate = false;  // C += A * B^T instead of C = A * B^T. Default: false.
};

// Floating-point operations of a GEMM: 2 * m * n * k.
inline double GemmFlops(int64_t m, int64_t n, int64_t k) {
  return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
}

// The paged KV cache of one layer and one sequence's block table, shared by KvAppend and
// PagedAttention. Token position p of the sequence lives at token p % block_size of block
// block_table[p / block_size], in the planes of `layout` (K = plane 0, V = plane 1).
struct PagedKvView {
  // The layer's layout: an MHA preset (not kMla) with elem_bytes 2. Borrowed for the call
  // only. Required.
  const KvLayout* layout = nullptr;
  // The layer's device tensor(s), spanning layout->tensor_span_bytes(t). Required.
  LayerTensors cache;
  // Device array of the sequence's block ids, at least ceil(positions / block_size) of
  // them, each in [0, layout->num_blocks()) (not checked: device memory). Read when the
  // launch runs. Required.
  const int32_t* block_table = nullptr;
};

// Writes K and V of `num_tokens` new tokens at positions [first_position, first_position +
// num_tokens) into the cache. Token i's K is k + i * k_token_stride (elements), [heads]
// [head_dim] contiguous; V likewise. Both device memory of element type `type`.
struct KvAppendArgs {
  ScalarType type = ScalarType::kFloat16;
  PagedKvView kv;
  int64_t first_position = 0;
  int64_t num_tokens = 0;
  const void* k = nullptr;
  int64_t k_token_stride = 0;  // >= heads * head_dim; 0 means heads * head_dim. Default: 0.
  const void* v = nullptr;
  int64_t v_token_stride = 0;  // As k_token_stride. Default: 0.
};

// Causal attention of `num_tokens` new query tokens at positions [first_position,
// first_position + num_tokens) over cache positions [0, first_position + num_tokens):
// query token i attends to positions [0, first_position + i] (the cache must already hold
// them, e.g. by LaunchKvAppend earlier on the stream). Grouped-query attention: query head
// h reads KV head h / (num_q_heads / layout heads).
//   q:   token i, head h at q + i * q_token_stride + h * head_dim (elements).
//   out: token i, head h at out + i * out_token_stride + h * head_dim; written.
//   out[i][h] = sum_p softmax_p(scale * q[i][h] . K[p][h']) * V[p][h'].
// `workspace` is device scratch of at least PagedAttentionWorkspaceBytes(args) bytes
// (cuBLAS-based attention materializes score tiles there); the host backend uses none of
// it but requires it all the same, so both backends accept the same arguments.
struct PagedAttentionArgs {
  ScalarType type = ScalarType::kFloat16;
  PagedKvView kv;
  int64_t first_position = 0;
  int64_t num_tokens = 0;
  int64_t num_q_heads = 0;  // A positive multiple of the layout's KV heads.
  const void* q = nullptr;
  int64_t q_token_stride = 0;  // >= num_q_heads * head_dim; 0 means that. Default: 0.
  void* out = nullptr;
  int64_t out_token_stride = 0;  // As q_token_stride. Default: 0.
  // Softmax scale; 0 means 1 / sqrt(head_dim). Default: 0.
  float scale = 0;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

// Query tokens whose scores one cuBLAS attention step materializes at a time.
inline constexpr int64_t kAttentionQueryTileTokens = 512;

// Scratch bytes a PagedAttention launch with these arguments needs: contiguous copies of the
// context's K and V (2 * kv_heads * context * head_dim elements) plus fp32 scores and
// fp16/bf16 probabilities of one query tile (num_q_heads * min(num_tokens, tile) *
// context). Context = first_position + num_tokens. 0 for invalid arguments.
size_t PagedAttentionWorkspaceBytes(const PagedAttentionArgs& args);

// Useful floating-point operations of causal attention for `num_tokens` new tokens after
// `first_position` cached ones: 4 * num_q_heads * head_dim * sum_i (first_position + i + 1)
// (QK^T and PV, masked entries not counted).
double PagedAttentionFlops(int64_t first_position, int64_t num_tokens, int64_t num_q_heads,
                           int64_t head_dim);

}  // namespace kvtier::gpu
