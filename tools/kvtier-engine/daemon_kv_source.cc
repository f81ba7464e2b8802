#include "daemon_kv_source.h"

#include <string>
#include <vector>

namespace kvtier::engine {
namespace {

gpu::GpuStatus FromStatus(const Status& s) { return gpu::GpuStatus::Unavailable(s.ToString()); }

}  // namespace

gpu::GpuStatus DaemonKvSource::StartLoad(gpu::engine::PagedCache& cache, gpu::Stream& load_stream) {
  if (loader_) return gpu::GpuStatus::InvalidArgument("a load is in progress");
  auto loader = std::make_unique<LayerwiseLoader>(
      client_, ns_, arena_, PagedKvCache{cache.spec, cache.layer_tensors}, runtime_);
  Result<uint64_t> got = loader->StartLoad(prompt_, cache.block_table, load_stream);
  if (!got.ok()) return FromStatus(got.status());
  loader_ = std::move(loader);
  if (got.value() != static_cast<uint64_t>(cached_tokens_)) {
    return gpu::GpuStatus::Unavailable("kvtierd delivered " + std::to_string(got.value()) + " of " +
                                       std::to_string(cached_tokens_) + " cached tokens");
  }
  return gpu::GpuStatus::Ok();
}

gpu::GpuStatus DaemonKvSource::WaitLayer(int64_t layer, gpu::Stream& compute_stream) {
  if (!loader_) return gpu::GpuStatus::InvalidArgument("no load started");
  const Status s = loader_->WaitLayer(layer, compute_stream);
  return s.ok() ? gpu::GpuStatus::Ok() : FromStatus(s);
}

gpu::GpuStatus DaemonKvSource::FinishLoad() {
  if (!loader_) return gpu::GpuStatus::InvalidArgument("no load started");
  Result<std::vector<int32_t>> redo = loader_->Finish();
  loader_.reset();
  if (!redo.ok()) return FromStatus(redo.status());
  if (!redo.value().empty()) {
    return gpu::GpuStatus::DeviceError(std::to_string(redo.value().size()) +
                                       " blocks failed to load");
  }
  return gpu::GpuStatus::Ok();
}

}  // namespace kvtier::engine
