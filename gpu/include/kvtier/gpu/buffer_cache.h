// BufferCache: device buffers kept for reuse by the transfers of one process.
//
// A layerwise load or store needs device memory of its own (the DMA staging buffer, the
// chunk-address and block-id arrays). Allocating and freeing it per request would call
// cudaFree per request, and cudaFree synchronizes the whole device: the engine's compute
// would stall on every load. A BufferCache lends buffers instead and takes them back.
#pragma once

#include <cstddef>
#include <map>
#include <mutex>

#include "kvtier/gpu/device_buffer.h"
#include "kvtier/gpu/gpu_status.h"

namespace kvtier::gpu {

class BufferCache;
class Runtime;

// A device buffer lent by a BufferCache (given back when destroyed), or owned outright.
// REQUIRES: no queued work uses the memory when it is destroyed or reset.
// Thread-safety: not thread-safe.
class ScratchBuffer {
 public:
  ScratchBuffer() = default;  // Empty.
  // Owns `buffer` outright: freed when destroyed.
  explicit ScratchBuffer(DeviceBuffer buffer) : buffer_(std::move(buffer)) {}
  ~ScratchBuffer() { Reset(); }
  ScratchBuffer(ScratchBuffer&& other) noexcept = default;
  ScratchBuffer& operator=(ScratchBuffer&& other) noexcept;
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;

  void* data() const { return buffer_.data(); }
  // At least what was asked for.
  size_t size_bytes() const { return buffer_.size_bytes(); }
  // Gives the buffer back to its cache (or frees it) and leaves this empty.
  void Reset();

 private:
  friend class BufferCache;
  ScratchBuffer(DeviceBuffer buffer, BufferCache* home) : buffer_(std::move(buffer)), home_(home) {}

  DeviceBuffer buffer_;
  BufferCache* home_ = nullptr;
};

// Thread-safety: thread-safe.
class BufferCache {
 public:
  // Keeps at most `max_idle_bytes` of buffers given back; past that, a buffer given back
  // is freed. Default: 1 GiB. REQUIRES: `runtime` outlives the cache.
  explicit BufferCache(Runtime& runtime, size_t max_idle_bytes = size_t{1} << 30)
      : runtime_(runtime), max_idle_bytes_(max_idle_bytes) {}
  // Frees the idle buffers. REQUIRES: every buffer it lent was given back.
  ~BufferCache() = default;
  BufferCache(const BufferCache&) = delete;
  BufferCache& operator=(const BufferCache&) = delete;

  // Lends a buffer of at least `bytes` (> 0): an idle one of at most twice that size, or a
  // new one of `bytes` rounded up to a power of two (at least 4 KiB).
  // Errors: those of Runtime::Allocate.
  GpuStatus Take(size_t bytes, ScratchBuffer* out);

  // Bytes of idle buffers held now.
  size_t idle_bytes() const;

 private:
  friend class ScratchBuffer;
  void Give(DeviceBuffer buffer);

  Runtime& runtime_;
  const size_t max_idle_bytes_;
  mutable std::mutex mu_;
  std::multimap<size_t, DeviceBuffer> idle_;  // GUARDED_BY(mu_); by size
  size_t idle_bytes_ = 0;                     // GUARDED_BY(mu_)
};

}  // namespace kvtier::gpu
