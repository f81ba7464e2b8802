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
//   load->Start();                                // queues the first layers
//   for i: load->WaitLayer(i, compute); attention(i) on compute;  // queues a layer more
//   load->Finish(&report);                        // queues the rest, waits, names the
//                                                 // blocks to recompute
// Layers are queued options.queue_ahead_layers ahead of WaitLayer, not all at Start: a
// load with no WaitLayer calls (load, then compute) is complete after Finish only.
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

  // Queues layers 0, 1, ... up to options.queue_ahead_layers (all of them for 0) in
  // order on the load stream, recording layer_event(i) after layer i's copies. Call once.
  // Per-chunk refusals are reported by Finish. Errors: kInvalidArgument (already
  // started), kDeviceError (a launch or record failed; the layers from there on are
  // reported failed by Finish).
  GpuStatus Start();

  // Queues the layers up to layer + queue_ahead_layers not queued yet, then makes work
  // queued on compute_stream after this call wait until layer `layer` is in the cache
  // (cudaStreamWaitEvent; never blocks the host on the copies).
  // Errors: kInvalidArgument (not started, layer out of range, or not queued because
  // queueing an earlier layer failed), kDeviceError.
  GpuStatus WaitLayer(int64_t layer, Stream& compute_stream);

  // The event recorded after layer `layer`'s copies (valid once queued: by Start,
  // WaitLayer of a layer at most queue_ahead_layers before it, or Finish).
  const Event& layer_event(int64_t layer) const { return events_[layer]; }
  int64_t num_layers() const { return static_cast<int64_t>(events_.size()); }

  // Queues the layers not queued yet, blocks until every queued layer completed and sets
  // *report: the chunks whose copy
  // failed, with their block ids (the engine recomputes them). Returns OK when the
  // failures are per chunk; a device error of the stream (CUDA cannot attribute it to a
  // chunk) fails every chunk from that layer and is returned. Errors: kInvalidArgument (not
  // started, null report), kDeviceError.
  GpuStatus Finish(KvCopyReport* report);

 private:
  LayerwiseLoad(Runtime& runtime, std::unique_ptr<KvTransfer> transfer,
                std::vector<LayerTensors> layers, int64_t queue_ahead_layers);

  // Queues layers queued_layers_ .. end - 1 (end at most num_layers()); stops at the
  // first failure, which fails the chunks from that layer on and is returned again by
  // every later call.
  GpuStatus QueueUpTo(int64_t end);

  Runtime& runtime_;
  std::unique_ptr<KvTransfer> transfer_;
  std::vector<LayerTensors> layers_;
  std::vector<Event> events_;
  const int64_t queue_ahead_layers_;  // 0: every layer at Start.
  int64_t queued_layers_ = 0;         // Layers whose event is recorded.
  GpuStatus queue_error_;             // The failure that stopped queueing, if any.
  bool started_ = false;
  bool finished_ = false;
};

}  // namespace kvtier::gpu
