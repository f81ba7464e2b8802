#include <algorithm>
#include <cstdint>

#include "kv_copy_kernel.h"

namespace kvtier::gpu::internal {
namespace {

constexpr int kThreadsPerBlock = 128;
// Enough row-blocks per chunk to cover an H200 (132 SMs) even with a single chunk.
constexpr int64_t kMaxRowBlocks = 1024;
constexpr int64_t kMaxChunkBlocks = 65535;  // gridDim.y limit.

// blockIdx.y strides over chunks, blockIdx.x over the chunk's (plane, token) rows; the
// threads of a block cover one row's heads x units. Payload accesses of consecutive threads
// are consecutive units (coalesced on the PCIe / staging side).
template <typename U>
__global__ void KvCopyKernel(KvCopyParams p) {
  const int64_t rows = p.num_planes * p.chunk_tokens;
  const int32_t units_per_token = p.heads * p.units_per_row;
  for (int64_t c = blockIdx.y; c < p.num_chunks; c += gridDim.y) {
    const uint64_t addr = p.chunk_addrs[c];
    if (addr == 0) continue;
    unsigned char* payload = reinterpret_cast<unsigned char*>(addr + p.payload_offset_bytes);
    const int32_t* blocks = p.block_ids + c * p.blocks_per_chunk;
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
      const int64_t pl = row / p.chunk_tokens;
      const int64_t t = row - pl * p.chunk_tokens;
      const KvCopyPlaneParams& q = p.planes[pl];
      const int64_t block = blocks[t / p.block_size];
      if (block < 0) continue;  // kSkipBlock: the engine holds this block already
      unsigned char* cache_token = p.tensors[q.tensor] + q.offset_bytes +
                                   block * q.block_stride_bytes +
                                   (t % p.block_size) * q.token_stride_bytes;
      U* pay_token = reinterpret_cast<U*>(payload) + row * units_per_token;
      for (int32_t j = threadIdx.x; j < units_per_token; j += blockDim.x) {
        const int32_t h = j / p.units_per_row;
        const int32_t u = j - h * p.units_per_row;
        U* cache =
            reinterpret_cast<U*>(cache_token + h * q.head_stride_bytes + u * p.unit_stride_bytes);
        if (p.to_cache) {
          *cache = pay_token[j];
        } else {
          pay_token[j] = *cache;
        }
      }
    }
  }
}

template <typename U>
cudaError_t Launch(const KvCopyParams& p, cudaStream_t stream) {
  const int64_t rows = p.num_planes * p.chunk_tokens;
  const dim3 grid(static_cast<unsigned>(std::min(rows, kMaxRowBlocks)),
                  static_cast<unsigned>(std::min(p.num_chunks, kMaxChunkBlocks)));
  KvCopyKernel<U><<<grid, kThreadsPerBlock, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchKvCopyKernel(const KvCopyParams& params, cudaStream_t stream) {
  (void)cudaGetLastError();  // Report this launch only.
  switch (params.unit_bytes) {
    case 1:
      return Launch<uint8_t>(params, stream);
    case 2:
      return Launch<uint16_t>(params, stream);
    case 4:
      return Launch<uint32_t>(params, stream);
    case 8:
      return Launch<uint2>(params, stream);
    default:
      return Launch<uint4>(params, stream);
  }
}

}  // namespace kvtier::gpu::internal
