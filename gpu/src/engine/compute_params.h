// The compute operations' arguments resolved to element strides, shared by the CUDA kernels
// (compute_kernels.cu) and the host compute (the Run*OnHost loops below, compute_params.cc).
// Private to gpu/src/engine. Plain structs of C++17 so that nvcc compiles them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvtier/gpu/engine/compute.h"
#include "kvtier/gpu/gpu_status.h"

namespace kvtier::gpu::engine::internal {

// C = A * B^T with every leading dimension resolved (see GemmArgs).
struct GemmParams {
  ScalarType type;
  int64_t m, n, k;
  const void* a;
  int64_t lda;
  const void* b;
  int64_t ldb;
  void* c;
  int64_t ldc;
  bool accumulate;
};

// One plane (K or V) of a paged cache, strides in elements.
struct PagedPlaneParams {
  int32_t tensor;  // Index into PagedKvParams::tensors.
  int64_t offset;
  int64_t block_stride;
  int64_t token_stride;
  int64_t head_stride;
  int64_t dim_stride;
};

struct PagedKvParams {
  uint16_t* tensors[2];
  PagedPlaneParams planes[2];  // [0] K, [1] V.
  int64_t heads;
  int64_t head_dim;
  int64_t block_size;
  const int32_t* block_table;
};

// Element offset of (plane p, sequence position pos, head h, dim d); block from the table.
#if defined(__CUDACC__)
__host__ __device__
#endif
    inline uint16_t*
    PagedElement(const PagedKvParams& kv, int p, int64_t pos, int64_t h, int64_t d) {
  const PagedPlaneParams& q = kv.planes[p];
  const int64_t block = kv.block_table[pos / kv.block_size];
  return kv.tensors[q.tensor] + q.offset + block * q.block_stride +
         (pos % kv.block_size) * q.token_stride + h * q.head_stride + d * q.dim_stride;
}

struct KvAppendParams {
  ScalarType type;
  PagedKvParams kv;
  int64_t first_position;
  int64_t num_tokens;
  const uint16_t* k;
  int64_t k_token_stride;
  const uint16_t* v;
  int64_t v_token_stride;
};

// Workspace carve-up of the cuBLAS attention (byte offsets from the workspace start).
struct AttentionWorkspace {
  size_t k_offset;       // [kv_heads][context][head_dim] elements.
  size_t v_offset;       // Same.
  size_t scores_offset;  // fp32 [num_q_heads][tile][context].
  size_t probs_offset;   // fp16/bf16 [num_q_heads][tile][context].
  size_t total_bytes;
};

struct PagedAttentionParams {
  ScalarType type;
  PagedKvParams kv;
  int64_t first_position;
  int64_t num_tokens;
  int64_t num_q_heads;
  const uint16_t* q;
  int64_t q_token_stride;
  uint16_t* out;
  int64_t out_token_stride;
  float scale;
  unsigned char* workspace;
  AttentionWorkspace ws;
  int64_t tile_tokens;  // Query tokens per cuBLAS step (kAttentionQueryTileTokens).
};

// Validation + resolution (errors: kInvalidArgument naming the field, prefixed by `what`).
GpuStatus BuildGemmParams(const GemmArgs& args, GemmParams* out);
GpuStatus BuildKvAppendParams(const KvAppendArgs& args, KvAppendParams* out);
GpuStatus BuildPagedAttentionParams(const PagedAttentionArgs& args, PagedAttentionParams* out);

// The workspace carve-up for these sizes.
AttentionWorkspace PlanAttentionWorkspace(int64_t kv_heads, int64_t head_dim, int64_t q_heads,
                                          int64_t first_position, int64_t num_tokens);

// Host compute: run on the calling thread.
void RunGemmOnHost(const GemmParams& p);
void RunKvAppendOnHost(const KvAppendParams& p);
void RunPagedAttentionOnHost(const PagedAttentionParams& p);

}  // namespace kvtier::gpu::engine::internal
