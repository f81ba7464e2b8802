// DaemonKvSource: the test engine's cached prefix loaded from kvtierd through the client's
// LayerwiseLoader (one loader per load: lease every chunk, queue each layer's copies, then
// release the lease in FinishLoad).
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "kvtier/client.h"
#include "kvtier/gpu/engine/kv_source.h"
#include "kvtier/gpu/runtime.h"
#include "kvtier/layerwise.h"

namespace kvtier::engine {

// REQUIRES: the client, arena, runtime and prompt outlive it.
// Thread-safety: not thread-safe.
class DaemonKvSource final : public gpu::engine::KvSource {
 public:
  // Loads the first `cached_tokens` tokens of `prompt` (whole chunks of `ns`).
  DaemonKvSource(Client& client, NamespaceHandle ns, GpuArena& arena, gpu::Runtime& runtime,
                 std::span<const int32_t> prompt, int64_t cached_tokens)
      : client_(client),
        ns_(std::move(ns)),
        arena_(arena),
        runtime_(runtime),
        prompt_(prompt),
        cached_tokens_(cached_tokens) {}

  // Errors: kUnavailable when kvtierd delivers less than cached_tokens tokens or the
  // loader fails (the kvtier::Status in the message); kInvalidArgument (a load in progress).
  gpu::GpuStatus StartLoad(gpu::engine::PagedCache& cache, gpu::Stream& load_stream) override;
  gpu::GpuStatus WaitLayer(int64_t layer, gpu::Stream& compute_stream) override;
  // Errors: kUnavailable (the loader's Finish failed), kDeviceError (blocks to recompute).
  gpu::GpuStatus FinishLoad() override;

 private:
  Client& client_;
  const NamespaceHandle ns_;
  GpuArena& arena_;
  gpu::Runtime& runtime_;
  const std::span<const int32_t> prompt_;
  const int64_t cached_tokens_;
  std::unique_ptr<LayerwiseLoader> loader_;  // the load in progress
};

}  // namespace kvtier::engine
