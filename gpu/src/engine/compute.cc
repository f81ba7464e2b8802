#include "kvtier/gpu/engine/compute.h"

#include "compute_backend.h"
#include "compute_params.h"
#include "kvtier/gpu/runtime.h"
#include "kvtier/gpu/stream.h"

namespace kvtier::gpu::engine {
namespace {

std::unique_ptr<internal::ComputeBackend> NewBackend(Runtime& runtime) {
#if KVTIER_HAVE_CUDA
  if (runtime.backend() == Backend::kCuda) return internal::NewCudaCompute(runtime);
#endif
  return internal::NewHostCompute(runtime);
}

}  // namespace

Compute::Compute(Runtime& runtime) : runtime_(runtime), backend_(NewBackend(runtime)) {}

Compute::~Compute() = default;

GpuStatus Compute::CheckStream(const Stream& stream) const {
  if (!stream.valid()) return GpuStatus::InvalidArgument("stream is empty");
  if (stream.runtime() != &runtime_) {
    return GpuStatus::InvalidArgument("stream belongs to another runtime");
  }
  return GpuStatus::Ok();
}

GpuStatus Compute::LaunchGemm(const GemmArgs& args, Stream& stream) {
  if (GpuStatus s = CheckStream(stream); !s.ok()) return s;
  internal::GemmParams params;
  if (GpuStatus s = internal::BuildGemmParams(args, &params); !s.ok()) return s;
  if (params.m == 0 || params.n == 0) return GpuStatus::Ok();
  return backend_->LaunchGemm(params, stream);
}

GpuStatus Compute::LaunchKvAppend(const KvAppendArgs& args, Stream& stream) {
  if (GpuStatus s = CheckStream(stream); !s.ok()) return s;
  internal::KvAppendParams params;
  if (GpuStatus s = internal::BuildKvAppendParams(args, &params); !s.ok()) return s;
  if (params.num_tokens == 0) return GpuStatus::Ok();
  return backend_->LaunchKvAppend(params, stream);
}

GpuStatus Compute::LaunchPagedAttention(const PagedAttentionArgs& args, Stream& stream) {
  if (GpuStatus s = CheckStream(stream); !s.ok()) return s;
  internal::PagedAttentionParams params;
  if (GpuStatus s = internal::BuildPagedAttentionParams(args, &params); !s.ok()) return s;
  if (params.num_tokens == 0) return GpuStatus::Ok();
  return backend_->LaunchPagedAttention(params, stream);
}

}  // namespace kvtier::gpu::engine
