// LayerwiseStore: the mirror of LayerwiseLoad. Once the engine has queued layer i's KV
// writes, a store stream gathers that layer out of the paged cache into the chunk payloads
// while layer i+1 computes; one event per layer.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kvtier/gpu/event.h"
#include "kvtier/gpu/gpu_status.h"
#include "kvtier/gpu/kv_transfer.h"
#include "kvtier/gpu/runtime.h"
#include "kvtier/gpu/stream.h"

namespace kvtier::gpu {

// Usage (DESIGN.md "Layerwise store"; payloads are reserved arena slots):
//   LayerwiseStore::Create(runtime, chunks, layer_tensors, options, store_stream, &store);
//   for i: attention(i) writes KV on compute; store->LayerWritten(i, compute);
//   store->Finish(&report);   // commit every chunk not in report.failed_chunks
// REQUIRES: the runtime, store stream, layout, arena and device pool (KvChunkSet) outlive
// it. Destroying it before Finish synchronizes the store stream. Thread-safety: not
// thread-safe.
class LayerwiseStore {
 public:
  // As LayerwiseLoad::Create (block ids may repeat: gathering a block twice is harmless).
  static GpuStatus Create(Runtime& runtime, KvChunkSet chunks, std::vector<LayerTensors> layers,
                          const KvTransferOptions& options, Stream& store_stream,
                          std::unique_ptr<LayerwiseStore>* out);
  ~LayerwiseStore();
  LayerwiseStore(const LayerwiseStore&) = delete;
  LayerwiseStore& operator=(const LayerwiseStore&) = delete;

  // The engine has queued every write of layer `layer` on compute_stream: records an event
  // there, makes the store stream wait for it (no host sync), queues the layer's gather and
  // records layer_event(layer). Each layer once, in any order. Errors: kInvalidArgument
  // (layer out of range or already written, finished), kDeviceError.
  GpuStatus LayerWritten(int64_t layer, Stream& compute_stream);

  // Recorded after layer `layer` is in the payloads (valid once LayerWritten queued it).
  const Event& layer_event(int64_t layer) const { return stored_[layer]; }
  int64_t num_layers() const { return static_cast<int64_t>(stored_.size()); }

  // Blocks until every queued layer is stored and sets *report: the chunks whose payload is
  // incomplete (must not be committed). A layer never passed to LayerWritten fails every
  // chunk (kInvalidArgument, returned). A device error of the stream fails every chunk
  // from that layer and is returned. Errors: kInvalidArgument, kDeviceError.
  GpuStatus Finish(KvCopyReport* report);

 private:
  LayerwiseStore(Runtime& runtime, std::unique_ptr<KvTransfer> transfer,
                 std::vector<LayerTensors> layers);

  Runtime& runtime_;
  std::unique_ptr<KvTransfer> transfer_;
  std::vector<LayerTensors> layers_;
  std::vector<Event> written_;  // Recorded on the compute stream.
  std::vector<Event> stored_;   // Recorded on the store stream.
  std::vector<bool> queued_;
  bool finished_ = false;
};

}  // namespace kvtier::gpu
