// The host-emulation backend of Compute.
#include <memory>

#include "compute_backend.h"

namespace kvtier::gpu::engine::internal {
namespace {

class HostCompute final : public ComputeBackend {
 public:
  explicit HostCompute(Runtime& runtime) : runtime_(runtime) {}

  GpuStatus LaunchGemm(const GemmParams& params, Stream& stream) override {
    return runtime_.LaunchHostFunc(stream, [params] { RunGemmOnHost(params); });
  }
  GpuStatus LaunchKvAppend(const KvAppendParams& params, Stream& stream) override {
    return runtime_.LaunchHostFunc(stream, [params] { RunKvAppendOnHost(params); });
  }
  GpuStatus LaunchPagedAttention(const PagedAttentionParams& params, Stream& stream) override {
    return runtime_.LaunchHostFunc(stream, [params] { RunPagedAttentionOnHost(params); });
  }

 private:
  Runtime& runtime_;
};

}  // namespace

std::unique_ptr<ComputeBackend> NewHostCompute(Runtime& runtime) {
  return std::make_unique<HostCompute>(runtime);
}

}  // namespace kvtier::gpu::engine::internal
