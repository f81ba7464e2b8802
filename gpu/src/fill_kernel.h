// Launcher of the fill kernel (fill_kernel.cu), callable from host C++ compiled by g++.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace kvtier::gpu::internal {

// Queues a kernel on `stream` that writes the pattern of Runtime::LaunchFill to device
// memory [dst, dst + bytes). Any alignment of dst. REQUIRES: bytes > 0, dst device memory
// of the stream's device. Returns the launch error (cudaSuccess if queued); errors of the
// kernel itself appear later on the stream.
cudaError_t LaunchFillKernel(void* dst, size_t bytes, uint64_t seed, cudaStream_t stream);

}  // namespace kvtier::gpu::internal
