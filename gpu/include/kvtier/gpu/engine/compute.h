// Compute: the operations the test engine (engine.h) needs on top of the copy runtime: a
// half-precision GEMM (LaunchGemm), writing new tokens' K/V into a paged KV cache
// (LaunchKvAppend, vLLM's reshape_and_cache) and causal attention of new tokens over a paged
// KV cache (LaunchPagedAttention). One sequence per launch. Test-only code: it lives in
// kvtier_gpu_compute, which only the engine, its tools and its tests link; kvtierd and the
// client SDK (kvtier_gpu) carry none of it (no compute kernels, no cuBLAS).
//
// Precision: inputs and outputs in fp16 or bf16, products accumulated in fp32. The backends
// agree to fp16/bf16 rounding, not bit for bit (cuBLAS picks its own summation order).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "kvtier/gpu/gpu_status.h"
#include "kvtier/gpu/kv_copy.h"
#include "kvtier/gpu/kv_layout.h"

namespace kvtier::gpu {
class Runtime;  // kvtier/gpu/runtime.h (not included: nvcc compiles this header as C++17)
class Stream;   // kvtier/gpu/stream.h
}  // namespace kvtier::gpu

namespace kvtier::gpu::engine {

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
// All three are device memory of the Compute's runtime, of element type `type`.
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
// them, e.g. by Compute::LaunchKvAppend earlier on the stream). Grouped-query attention: query head
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

namespace internal {
class ComputeBackend;  // compute_backend.h
}  // namespace internal

// The compute operations on the streams of one Runtime, run by its backend: CUDA (cuBLAS,
// loaded with dlopen at the first GEMM, and the kernels of compute_kernels.cu) or host
// emulation (loops on the stream's worker thread, through Runtime::LaunchHostFunc).
//
// The Launch* methods follow Runtime's conventions: they validate their arguments, then only
// queue work and return at once; a call that fails queues nothing. CUDA reports errors of
// queued work later, from Runtime::QueryEvent, SynchronizeEvent or Synchronize
// (kDeviceError); the host backend's queued work cannot fail. Every method returns
// kInvalidArgument for an empty stream or one made by another Runtime.
//
// Thread-safety: all methods are thread-safe (CUDA: GEMMs and attention share one cuBLAS
// handle under a mutex). REQUIRES: the Runtime outlives this object.
class Compute {
 public:
  // Never fails: cuBLAS is loaded (and its handle created) at the first GEMM or attention.
  explicit Compute(Runtime& runtime);
  ~Compute();
  Compute(const Compute&) = delete;
  Compute& operator=(const Compute&) = delete;

  Runtime& runtime() const { return runtime_; }

  // Queues C = A * B^T (see GemmArgs). CUDA: cublasGemmEx (fp32 compute, tensor cores);
  // host backend: a loop on the stream's thread. m == 0 or n == 0 queues nothing.
  // REQUIRES: the matrices stay valid until the launch completes.
  // Errors: kInvalidArgument (bad type, sizes or leading dimensions; null matrix),
  // kUnavailable (CUDA: cuBLAS cannot be loaded), kDeviceError.
  GpuStatus LaunchGemm(const GemmArgs& args, Stream& stream);

  // Queues writing new tokens' K and V into a paged KV cache (see KvAppendArgs). CUDA: one
  // kernel; host backend: the same on the stream's thread. num_tokens == 0 queues nothing.
  // Errors: kInvalidArgument (an MLA or non-2-byte layout, null tensor/table/k/v, negative
  // positions, more positions than the cache has blocks, strides below a row), kDeviceError.
  GpuStatus LaunchKvAppend(const KvAppendArgs& args, Stream& stream);

  // Queues causal attention of new tokens over a paged KV cache (see PagedAttentionArgs).
  // CUDA: K/V gathered into the workspace, then per query tile two strided-batched
  // cublasGemmEx calls per query head of a KV group and a masked softmax kernel; host
  // backend: a direct loop. num_tokens == 0 queues nothing.
  // Errors: kInvalidArgument (as LaunchKvAppend, plus num_q_heads not a multiple of the KV
  // heads, a workspace smaller than PagedAttentionWorkspaceBytes or not 256-byte aligned,
  // a negative or non-finite scale), kUnavailable (CUDA: cuBLAS cannot be loaded),
  // kDeviceError.
  GpuStatus LaunchPagedAttention(const PagedAttentionArgs& args, Stream& stream);

 private:
  GpuStatus CheckStream(const Stream& stream) const;

  Runtime& runtime_;
  const std::unique_ptr<internal::ComputeBackend> backend_;
};

}  // namespace kvtier::gpu::engine
