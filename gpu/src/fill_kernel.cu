#include <algorithm>

#include "fill_kernel.h"
#include "fill_pattern.h"

namespace kvtier::gpu::internal {
namespace {

constexpr int kThreadsPerBlock = 256;
// Enough blocks to fill an H100/H200 (132 SMs x 8 resident blocks); the loop is grid-strided.
constexpr uint64_t kMaxBlocks = 1024;

// One thread per 8-byte pattern word, grid-strided. Whole words at 8-byte aligned
// addresses are one 64-bit store; the rest (misaligned dst, tail) are byte stores.
__global__ void FillKernel(unsigned char* dst, uint64_t bytes, uint64_t seed) {
  const uint64_t num_words = (bytes + 7) / 8;
  const bool aligned = (reinterpret_cast<uintptr_t>(dst) & 7) == 0;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t w = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; w < num_words;
       w += stride) {
    const uint64_t value = FillPatternWord(seed, w);
    const uint64_t offset = w * 8;
    if (aligned && offset + 8 <= bytes) {
      *reinterpret_cast<uint64_t*>(dst + offset) = value;
    } else {
      const uint64_t n = bytes - offset < 8 ? bytes - offset : 8;
      for (uint64_t b = 0; b < n; ++b) {
        dst[offset + b] = static_cast<unsigned char>(value >> (8 * b));
      }
    }
  }
}

}  // namespace

cudaError_t LaunchFillKernel(void* dst, size_t bytes, uint64_t seed, cudaStream_t stream) {
  const uint64_t num_words = (static_cast<uint64_t>(bytes) + 7) / 8;
  const uint64_t blocks =
      std::min<uint64_t>(kMaxBlocks, (num_words + kThreadsPerBlock - 1) / kThreadsPerBlock);
  // Clear this thread's last error (an earlier call already returned it, e.g. a failed
  // cudaMalloc) so that the check below reports this launch only.
  (void)cudaGetLastError();
  FillKernel<<<static_cast<unsigned>(blocks), kThreadsPerBlock, 0, stream>>>(
      static_cast<unsigned char*>(dst), bytes, seed);
  return cudaGetLastError();
}

}  // namespace kvtier::gpu::internal
