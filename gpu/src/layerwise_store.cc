#include "kvtier/gpu/layerwise_store.h"

#include <string>
#include <utility>

#include "layer_tensors_check.h"

namespace kvtier::gpu {

LayerwiseStore::LayerwiseStore(Runtime& runtime, std::unique_ptr<KvTransfer> transfer,
                               std::vector<LayerTensors> layers)
    : runtime_(runtime), transfer_(std::move(transfer)), layers_(std::move(layers)) {}

LayerwiseStore::~LayerwiseStore() {
  if (!finished_) (void)runtime_.Synchronize(transfer_->stream());
}

GpuStatus LayerwiseStore::Create(Runtime& runtime, KvChunkSet chunks,
                                 std::vector<LayerTensors> layers, const KvTransferOptions& options,
                                 Stream& store_stream, std::unique_ptr<LayerwiseStore>* out) {
  if (out == nullptr) return GpuStatus::InvalidArgument("LayerwiseStore: out is null");
  if (GpuStatus s = internal::CheckLayerTensors(chunks, layers, "LayerwiseStore"); !s.ok()) {
    return s;
  }
  for (int32_t id : chunks.block_ids) {
    if (id == kSkipBlock) {
      return GpuStatus::InvalidArgument(
          "LayerwiseStore: block id -1 (skip): every block of a "
          "stored chunk must be copied");
    }
  }
  std::unique_ptr<KvTransfer> transfer;
  if (GpuStatus s =
          KvTransfer::Create(runtime, std::move(chunks), options, store_stream, &transfer);
      !s.ok()) {
    return s;
  }
  std::unique_ptr<LayerwiseStore> store(
      new LayerwiseStore(runtime, std::move(transfer), std::move(layers)));
  const size_t n = store->layers_.size();
  store->written_.resize(n);
  store->stored_.resize(n);
  store->queued_.assign(n, false);
  for (size_t i = 0; i < n; ++i) {
    if (GpuStatus s = runtime.CreateEvent(&store->written_[i]); !s.ok()) return s;
    if (GpuStatus s = runtime.CreateEvent(&store->stored_[i]); !s.ok()) return s;
  }
  *out = std::move(store);
  return GpuStatus::Ok();
}

GpuStatus LayerwiseStore::LayerWritten(int64_t layer, Stream& compute_stream) {
  if (finished_) return GpuStatus::InvalidArgument("LayerwiseStore: already finished");
  if (layer < 0 || layer >= num_layers() || queued_[layer]) {
    return GpuStatus::InvalidArgument("LayerwiseStore::LayerWritten: layer " +
                                      std::to_string(layer) + " out of range or already written");
  }
  Stream& store_stream = transfer_->stream();
  if (GpuStatus s = runtime_.RecordEvent(written_[layer], compute_stream); !s.ok()) return s;
  if (GpuStatus s = runtime_.StreamWaitEvent(store_stream, written_[layer]); !s.ok()) return s;
  queued_[layer] = true;  // From here the layer's outcome is in the transfer's failures.
  if (GpuStatus s = transfer_->QueueLayer(layer, KvCopyDirection::kCacheToPayload, layers_[layer]);
      !s.ok()) {
    return s;
  }
  if (GpuStatus s = runtime_.RecordEvent(stored_[layer], store_stream); !s.ok()) {
    transfer_->FailRemaining(layer, s);
    return s;
  }
  return GpuStatus::Ok();
}

GpuStatus LayerwiseStore::Finish(KvCopyReport* report) {
  if (report == nullptr)
    return GpuStatus::InvalidArgument("LayerwiseStore::Finish: report is null");
  if (finished_) return GpuStatus::InvalidArgument("LayerwiseStore: already finished");
  GpuStatus result;
  if (GpuStatus s = runtime_.Synchronize(transfer_->stream()); !s.ok()) {
    transfer_->FailRemaining(0, s);  // CUDA cannot say which layer; fail from the start.
    result = s;
  }
  for (int64_t i = 0; i < num_layers() && result.ok(); ++i) {
    if (!queued_[i]) {
      result = GpuStatus::InvalidArgument("LayerwiseStore::Finish: layer " + std::to_string(i) +
                                          " was never written");
      transfer_->FailRemaining(i, result);
    }
  }
  finished_ = true;
  *report = transfer_->Report();
  return result;
}

}  // namespace kvtier::gpu
