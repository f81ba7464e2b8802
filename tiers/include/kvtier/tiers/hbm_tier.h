// HbmTier: the opt-in GPU tier (DESIGN.md "tier"): a SlotTier over one device
// memory pool that the daemon allocates with cudaMalloc and exports with CUDA
// IPC. Clients on the same GPU open the pool once (by its IPC handle, sent in
// SessionOpened) and copy leased chunks device to device.
//
// HBM is a subset of DRAM: the daemon copies a chunk in only from its DRAM
// slot, and drops the HBM copy when DRAM evicts the chunk. A slot holds the
// same slot image as DRAM (header, then payload) under a sequence of its own,
// so a client can check the HBM copy's sequence after its copies, as it does
// in DRAM.
//
// Backends: `cuda` (the real one), and `host` for tests and CI without a GPU:
// the pool is shared host memory that clients map by its handle, as the gpu
// module's host emulation does. Never the default.
//
// Thread-safety: the SlotTier bookkeeping is not thread-safe (the daemon
// serializes it with its mutex); CopyIn is thread-safe and is called without it.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "kvtier/arena.h"
#include "kvtier/gpu/runtime.h"
#include "kvtier/slot_image.h"
#include "kvtier/status.h"
#include "kvtier/tiers/slot_tier.h"

namespace kvtier {

enum class HbmBackend { kCuda, kHost };

// "cuda" or "host"; INVALID_ARGUMENT otherwise.
Result<HbmBackend> ParseHbmBackend(const std::string& name);

struct HbmTierOptions {
  // Pool size in bytes, a positive multiple of 4 KiB.
  uint64_t bytes = 0;
  // CUDA device ordinal of the pool (as the daemon's process sees it). Default: 0.
  int device = 0;
  // Default: cuda. `host` emulates the device with shared host memory (tests only).
  HbmBackend backend = HbmBackend::kCuda;
  // Which chunk goes when the pool is full. Default: leaf-first LRU.
  EvictionPolicyKind eviction = EvictionPolicyKind::kLru;
};

class HbmTier : public SlotTier {
 public:
  // Allocates and exports the pool. `dram` (optional) is registered with the
  // runtime so that copies into HBM run from pinned memory.
  // Errors: INVALID_ARGUMENT (a bad size or device ordinal), UNAVAILABLE (no
  // GPU or no CUDA driver: the message says how to turn the tier off),
  // RESOURCE_EXHAUSTED (the GPU has not that much free memory).
  static Result<std::unique_ptr<HbmTier>> Create(const HbmTierOptions& options, const Arena* dram);
  ~HbmTier() override;

  // The pool's IPC handle (opaque bytes; gpu::Runtime::OpenExported opens it).
  const std::string& ipc_handle() const { return ipc_handle_; }
  // "cuda" or "host": the runtime a client needs to open the handle.
  const char* backend_name() const;
  int device() const { return options_.device; }

  // Copies the slot image at `image` (`layout.slot_bytes`, a DRAM slot the
  // caller keeps pinned) into HBM slot `slot_offset`, its header stamped with
  // `sequence` (a fresh one: DESIGN.md, the lapsed-lease check): the old
  // header's sequence is cleared first and the header is written last, so
  // that a reader whose lease lapsed sees the change. Blocks until the copy
  // completed. Copies are serialized on the tier's stream. Errors:
  // UNAVAILABLE (a device error).
  Status CopyIn(uint64_t slot_offset, const std::byte* image, const SlotLayout& layout,
                uint64_t sequence);

 private:
  HbmTier(const HbmTierOptions& options, std::unique_ptr<gpu::Runtime> runtime)
      : SlotTier(options.bytes, NewEvictionPolicy(options.eviction)),
        options_(options),
        runtime_(std::move(runtime)) {}

  const HbmTierOptions options_;
  std::unique_ptr<gpu::Runtime> runtime_;  // outlives every handle below
  gpu::DeviceBuffer pool_;
  gpu::PinnedRange dram_pin_;
  std::string ipc_handle_;
  std::mutex copy_mu_;
  gpu::Stream stream_;  // GUARDED_BY(copy_mu_)
};

}  // namespace kvtier
