#include "kvtier/gpu/layerwise_load.h"

#include <algorithm>
#include <string>
#include <unordered_set>
#include <utility>

#include "layer_tensors_check.h"

namespace kvtier::gpu {

LayerwiseLoad::LayerwiseLoad(Runtime& runtime, std::unique_ptr<KvTransfer> transfer,
                             std::vector<LayerTensors> layers, int64_t queue_ahead_layers)
    : runtime_(runtime),
      transfer_(std::move(transfer)),
      layers_(std::move(layers)),
      queue_ahead_layers_(queue_ahead_layers) {}

LayerwiseLoad::~LayerwiseLoad() {
  // Create queued uploads and Start queued copies that use memory freed below.
  if (!finished_) (void)runtime_.Synchronize(transfer_->stream());
}

GpuStatus LayerwiseLoad::Create(Runtime& runtime, KvChunkSet chunks,
                                std::vector<LayerTensors> layers, const KvTransferOptions& options,
                                Stream& load_stream, std::unique_ptr<LayerwiseLoad>* out) {
  if (out == nullptr) return GpuStatus::InvalidArgument("LayerwiseLoad: out is null");
  if (GpuStatus s = internal::CheckLayerTensors(chunks, layers, "LayerwiseLoad"); !s.ok()) return s;
  if (options.queue_ahead_layers < 0) {
    return GpuStatus::InvalidArgument("LayerwiseLoad: queue_ahead_layers " +
                                      std::to_string(options.queue_ahead_layers) + " is negative");
  }
  std::unordered_set<int32_t> seen;
  for (int32_t id : chunks.block_ids) {
    if (id != kSkipBlock && !seen.insert(id).second) {
      return GpuStatus::InvalidArgument("LayerwiseLoad: block id " + std::to_string(id) +
                                        " is the destination of two tokens");
    }
  }
  std::unique_ptr<KvTransfer> transfer;
  if (GpuStatus s = KvTransfer::Create(runtime, std::move(chunks), options, load_stream, &transfer);
      !s.ok()) {
    return s;
  }
  std::unique_ptr<LayerwiseLoad> load(new LayerwiseLoad(
      runtime, std::move(transfer), std::move(layers), options.queue_ahead_layers));
  load->events_.resize(load->layers_.size());
  for (Event& event : load->events_) {
    if (GpuStatus s = runtime.CreateEvent(&event); !s.ok()) return s;
  }
  *out = std::move(load);
  return GpuStatus::Ok();
}

GpuStatus LayerwiseLoad::Start() {
  if (started_) return GpuStatus::InvalidArgument("LayerwiseLoad: already started");
  started_ = true;
  return QueueUpTo(queue_ahead_layers_ == 0 ? num_layers() : queue_ahead_layers_);
}

GpuStatus LayerwiseLoad::QueueUpTo(int64_t end) {
  end = std::min(end, num_layers());
  for (int64_t i = queued_layers_; i < end && queue_error_.ok(); ++i) {
    if (GpuStatus s = transfer_->QueueLayer(i, KvCopyDirection::kPayloadToCache, layers_[i]);
        !s.ok()) {
      queue_error_ = s;
      break;
    }
    if (GpuStatus s = runtime_.RecordEvent(events_[i], transfer_->stream()); !s.ok()) {
      transfer_->FailRemaining(i, s);
      queue_error_ = s;
      break;
    }
    queued_layers_ = i + 1;
  }
  return queue_error_;
}

GpuStatus LayerwiseLoad::WaitLayer(int64_t layer, Stream& compute_stream) {
  if (!started_ || layer < 0 || layer >= num_layers()) {
    return GpuStatus::InvalidArgument("LayerwiseLoad::WaitLayer: layer " + std::to_string(layer) +
                                      " is not queued (Start first)");
  }
  // A queueing failure is reported by Finish, per chunk; the layers queued before it
  // can still be waited for.
  (void)QueueUpTo(layer + 1 + queue_ahead_layers_);
  if (layer >= queued_layers_) {
    return GpuStatus::InvalidArgument(
        "LayerwiseLoad::WaitLayer: layer " + std::to_string(layer) +
        " is not queued (queueing failed: " + queue_error_.ToString() + ")");
  }
  return runtime_.StreamWaitEvent(compute_stream, events_[layer]);
}

GpuStatus LayerwiseLoad::Finish(KvCopyReport* report) {
  if (report == nullptr) return GpuStatus::InvalidArgument("LayerwiseLoad::Finish: report is null");
  if (!started_) return GpuStatus::InvalidArgument("LayerwiseLoad::Finish: not started");
  (void)QueueUpTo(num_layers());  // a failure stops queueing: the checks below report it
  GpuStatus result;
  for (int64_t i = 0; i < queued_layers_ && result.ok(); ++i) {
    if (GpuStatus s = runtime_.SynchronizeEvent(events_[i]); !s.ok()) {
      transfer_->FailRemaining(i, s);
      result = s;
    }
  }
  if (result.ok() && queued_layers_ < num_layers()) {
    // Queueing stopped early; QueueLayer already failed the remaining chunks.
    result = GpuStatus::DeviceError("LayerwiseLoad: only " + std::to_string(queued_layers_) +
                                    " of " + std::to_string(num_layers()) + " layers were queued");
    transfer_->FailRemaining(queued_layers_, result);
  }
  // Refused copies are not stream errors; make sure nothing is still running either way.
  if (GpuStatus s = runtime_.Synchronize(transfer_->stream()); !s.ok() && result.ok()) {
    transfer_->FailRemaining(num_layers() - 1, s);
    result = s;
  }
  finished_ = true;
  *report = transfer_->Report();
  return result;
}

}  // namespace kvtier::gpu
