// KvSource: where the test engine's cached prefix KV comes from when TtftBench serves a
// prompt by loading instead of recomputing (kvtierd through the client's LayerwiseLoader in
// kvtier-engine; a registered host buffer through gpu::LayerwiseLoad in
// kvtier-engine-standalone).
#pragma once

#include <cstdint>

#include "kvtier/gpu/engine/engine.h"
#include "kvtier/gpu/gpu_status.h"
#include "kvtier/gpu/stream.h"

namespace kvtier::gpu::engine {

// One load at a time: StartLoad, then any WaitLayer calls, then FinishLoad.
// Thread-safety: not thread-safe (called from the bench's one thread).
class KvSource {
 public:
  virtual ~KvSource() = default;

  // Starts loading the K and V of prefix positions [0, cached_tokens) of every layer into
  // `cache` (through its block table) on `load_stream`, layer by layer, and returns without
  // waiting. Layers may be queued as WaitLayer asks for them: only FinishLoad promises
  // the whole prefix is in the cache. The whole prefix must be promised: a source that can deliver
  // less returns an error. REQUIRES: no load in progress; `cache` and the stream outlive
  // FinishLoad. Errors: any code, with a message naming the cause.
  virtual GpuStatus StartLoad(PagedCache& cache, Stream& load_stream) = 0;

  // Makes work queued on `compute_stream` after this call wait until layer `layer` of the
  // current load is in the cache, without blocking the host. Errors: kInvalidArgument (no
  // load started, layer out of range), kDeviceError.
  virtual GpuStatus WaitLayer(int64_t layer, Stream& compute_stream) = 0;

  // Queues what is left, blocks until every copy of the current load completed and ends it
  // (releasing what the source held for it). Errors: any code when a part of the prefix was not
  // delivered.
  virtual GpuStatus FinishLoad() = 0;
};

}  // namespace kvtier::gpu::engine
