#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cfloat>

#include "compute_kernels.h"

namespace kvtier::gpu::engine::internal {
namespace {

constexpr int kThreadsPerBlock = 256;
constexpr int64_t kMaxBlocks = 4096;  // The copy kernels are grid-strided.

unsigned GridFor(int64_t items) {
  return static_cast<unsigned>(
      std::min<int64_t>(kMaxBlocks, (items + kThreadsPerBlock - 1) / kThreadsPerBlock));
}

__global__ void KvAppendKernel(KvAppendParams p) {
  const int64_t row = p.kv.heads * p.kv.head_dim;
  const int64_t total = p.num_tokens * row;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = idx / row;
    const int64_t e = idx % row;
    const int64_t h = e / p.kv.head_dim;
    const int64_t d = e % p.kv.head_dim;
    const int64_t pos = p.first_position + i;
    *PagedElement(p.kv, 0, pos, h, d) = p.k[i * p.k_token_stride + e];
    *PagedElement(p.kv, 1, pos, h, d) = p.v[i * p.v_token_stride + e];
  }
}

__global__ void KvGatherKernel(PagedKvParams kv, int64_t context, uint16_t* k_out,
                               uint16_t* v_out) {
  const int64_t per_plane = kv.heads * context * kv.head_dim;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       idx < 2 * per_plane; idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int plane = idx >= per_plane ? 1 : 0;
    const int64_t e = idx - plane * per_plane;  // [heads][context][head_dim]
    const int64_t d = e % kv.head_dim;
    const int64_t pos = (e / kv.head_dim) % context;
    const int64_t h = e / (kv.head_dim * context);
    (plane == 0 ? k_out : v_out)[e] = *PagedElement(kv, plane, pos, h, d);
  }
}

__device__ float BlockReduce(float v, bool is_max, float* shared) {
  for (int off = 16; off > 0; off >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, v, off);
    v = is_max ? fmaxf(v, o) : v + o;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  v = lane < warps ? shared[lane] : (is_max ? -FLT_MAX : 0.0f);
  for (int off = 16; off > 0; off >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, v, off);
    v = is_max ? fmaxf(v, o) : v + o;
  }
  __syncthreads();  // shared[] is reused by the next reduction.
  return v;
}

template <typename T>
__device__ T FromFloat(float v);
template <>
__device__ __half FromFloat<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// One block per row.
template <typename T>
__global__ void MaskedSoftmaxKernel(const float* scores, T* probs, int64_t tile_rows,
                                    int64_t row_len, int64_t first_visible, float scale) {
  __shared__ float shared[32];
  const int64_t r = blockIdx.x;
  const float* s = scores + r * row_len;
  T* out = probs + r * row_len;
  const int64_t visible = min(row_len, first_visible + (r % tile_rows) + 1);
  float m = -FLT_MAX;
  for (int64_t i = threadIdx.x; i < visible; i += blockDim.x) m = fmaxf(m, s[i] * scale);
  m = BlockReduce(m, true, shared);
  float sum = 0;
  for (int64_t i = threadIdx.x; i < visible; i += blockDim.x) sum += __expf(s[i] * scale - m);
  sum = BlockReduce(sum, false, shared);
  const float inv = 1.0f / sum;
  for (int64_t i = threadIdx.x; i < row_len; i += blockDim.x) {
    out[i] = FromFloat<T>(i < visible ? __expf(s[i] * scale - m) * inv : 0.0f);
  }
}

}  // namespace

cudaError_t LaunchKvAppendKernel(const KvAppendParams& p, cudaStream_t stream) {
  (void)cudaGetLastError();  // Report this launch only (see fill_kernel.cu).
  KvAppendKernel<<<GridFor(p.num_tokens * p.kv.heads * p.kv.head_dim), kThreadsPerBlock, 0,
                   stream>>>(p);
  return cudaGetLastError();
}

cudaError_t LaunchKvGatherKernel(const PagedKvParams& kv, int64_t context, uint16_t* k_out,
                                 uint16_t* v_out, cudaStream_t stream) {
  (void)cudaGetLastError();
  KvGatherKernel<<<GridFor(2 * kv.heads * context * kv.head_dim), kThreadsPerBlock, 0, stream>>>(
      kv, context, k_out, v_out);
  return cudaGetLastError();
}

cudaError_t LaunchMaskedSoftmaxKernel(ScalarType type, const float* scores, uint16_t* probs,
                                      int64_t rows, int64_t tile_rows, int64_t row_len,
                                      int64_t first_visible, float scale, cudaStream_t stream) {
  (void)cudaGetLastError();
  if (rows > 0x7FFFFFFF) return cudaErrorInvalidValue;
  const auto grid = static_cast<unsigned>(rows);
  if (type == ScalarType::kFloat16) {
    MaskedSoftmaxKernel<__half><<<grid, kThreadsPerBlock, 0, stream>>>(
        scores, reinterpret_cast<__half*>(probs), tile_rows, row_len, first_visible, scale);
  } else {
    MaskedSoftmaxKernel<__nv_bfloat16><<<grid, kThreadsPerBlock, 0, stream>>>(
        scores, reinterpret_cast<__nv_bfloat16*>(probs), tile_rows, row_len, first_visible, scale);
  }
  return cudaGetLastError();
}

}  // namespace kvtier::gpu::engine::internal
