// ComputeBackend: what Compute (kvtier/gpu/engine/compute.h) runs on, one per Runtime
// backend. Private to gpu/src/engine.
#pragma once

#include <memory>

#include "compute_params.h"
#include "kvtier/gpu/gpu_status.h"
#include "kvtier/gpu/runtime.h"
#include "kvtier/gpu/stream.h"

namespace kvtier::gpu::engine::internal {

// Arguments are validated by Compute: the stream is valid and of the Compute's runtime, the
// parameters are built by compute_params.h, and every count is > 0 (m, n; num_tokens).
class ComputeBackend {
 public:
  virtual ~ComputeBackend() = default;
  virtual GpuStatus LaunchGemm(const GemmParams& params, Stream& stream) = 0;
  virtual GpuStatus LaunchKvAppend(const KvAppendParams& params, Stream& stream) = 0;
  virtual GpuStatus LaunchPagedAttention(const PagedAttentionParams& params, Stream& stream) = 0;
};

// Host emulation: each launch is a Runtime::LaunchHostFunc running the loops of
// compute_params.cc on the stream's worker thread (device memory is host memory).
std::unique_ptr<ComputeBackend> NewHostCompute(Runtime& runtime);

#if KVTIER_HAVE_CUDA
// CUDA on runtime.device(): cuBLAS and the kernels of compute_kernels.cu (compute_cuda.cc).
std::unique_ptr<ComputeBackend> NewCudaCompute(Runtime& runtime);
#endif

}  // namespace kvtier::gpu::engine::internal
