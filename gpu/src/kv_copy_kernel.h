// Launcher of the gather/scatter kernel (kv_copy_kernel.cu), callable from host C++.
#pragma once

#include <cuda_runtime_api.h>

#include "kv_copy_params.h"

namespace kvtier::gpu::internal {

// Queues one kernel on `stream` that performs `params` (see KvLayerCopy for the mapping).
// REQUIRES: params.num_chunks > 0; every address in it device-accessible from the stream's
// device. Returns the launch error; errors of the kernel itself appear later on the stream.
cudaError_t LaunchKvCopyKernel(const KvCopyParams& params, cudaStream_t stream);

}  // namespace kvtier::gpu::internal
