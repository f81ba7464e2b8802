// LayerwiseLoad: queues a chunk set's layers (from a host arena or a device pool) -> paged
// cache on a load stream, one event per layer, so the engine's compute stream waits for
// layer i only before layer i.
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

// Usage (DESIGN.md "Layerwise load"; all chunks leased before Create):
//   LayerwiseLoad::Create(runtime, chunks, layer_tensors, options, load_stream, &load);
//   load->Start();                                // queues every layer, returns at once
//   for i: load->WaitLayer(i, compute); attention(i) on compute;
//   load->Finish(&report);                        // names the blocks to recompute
// REQUIRES: the runtime, load stream, layout, arena and device pool (KvChunkSet) outlive
// it. Destroying it before Finish synchronizes the load stream (its staging must not be
// freed under a copy).
// Thread-safety: not thread-safe.
class LayerwiseLoad {
 public:
  // layers[i]: device tensors of layer i; layers.size() == chunks.num_layers.
  // Errors: those of KvTransfer::Create; kInvalidArgument for a wrong layers size, a null
  // tensor, or a block id used twice (two chunks cannot load into one block).
  static GpuStatus Create(Runtime& runtime, KvChunkSet chunks, std::vector<LayerTensors> layers,
                          const KvTransferOptions& options, Stream& load_stream,
                          std::unique_ptr<LayerwiseLoad>* out);
  ~LayerwiseLoad();
  LayerwiseLoad(const LayerwiseLoad&) = delete;
  LayerwiseLoad& operator=(const LayerwiseLoad&) = delete;

  // Queues layer 0, 1, ... in order on the load stream, recording layer_event(i) after
  // layer i's copies. Call once. Per-chunk refusals are reported by Finish. Errors:
  // kInvalidArgument (already started), kDeviceError (a launch or record failed; the
  // layers from there on are reported failed by Finish).
  GpuStatus Start();

  // Makes work queued on compute_stream after this call wait until layer `layer` is in
  // the cache (cudaStreamWaitEvent; never blocks the host).
  // Errors: kInvalidArgument (not started, layer out of range or not queued), kDeviceError.
  GpuStatus WaitLayer(int64_t layer, Stream& compute_stream);

  // The event recorded after layer `layer`'s copies (valid once Start queued it).
  const Event& layer_event(int64_t layer) const { return events_[layer]; }
  int64_t num_layers() const { return static_cast<int64_t>(events_.size()); }

  // Blocks until every queued layer completed and sets *report: the chunks whose copy
  // failed, with their block ids (the engine recomputes them). Returns OK when the
  // failures are per chunk; a device error of the stream (CUDA cannot attribute it to a
  // chunk) fails every chunk from that layer and is returned. Errors: kInvalidArgument (not
  // started, null report), kDeviceError.
  GpuStatus Finish(KvCopyReport* report);

 private:
  LayerwiseLoad(Runtime& runtime, std::unique_ptr<KvTransfer> transfer,
                std::vector<LayerTensors> layers);

  Runtime& runtime_;
  std::unique_ptr<KvTransfer> transfer_;
  std::vector<LayerTensors> layers_;
  std::vector<Event> events_;
  int64_t queued_layers_ = 0;  // Layers whose event is recorded.
  bool started_ = false;
  bool finished_ = false;
};

}  // namespace kvtier::gpu
