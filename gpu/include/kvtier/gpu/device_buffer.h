// DeviceBuffer: RAII ownership of one device memory allocation made by a Runtime.
#pragma once

#include <cstddef>

namespace kvtier::gpu {

class Runtime;

// Owns `size_bytes()` bytes of device memory (CUDA: cudaMalloc; host backend: aligned host
// memory), aligned to Runtime::kDeviceAlignmentBytes, contents uninitialized. Freed on
// destruction or Reset(). A buffer from Runtime::OpenExported owns a mapping of another
// process's memory instead: freeing it closes the mapping.
//
// REQUIRES: the Runtime that made it outlives it, and no queued stream work still uses
// the memory when it is freed (synchronize the stream or an event first).
// Thread-safety: not thread-safe; the memory itself may be used by any stream.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;  // Empty: data() == nullptr.
  ~DeviceBuffer() { Reset(); }
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // Device address; a host address for the host backend. nullptr when empty.
  void* data() const { return data_; }
  size_t size_bytes() const { return size_bytes_; }
  bool empty() const { return data_ == nullptr; }
  // The runtime that owns the memory; nullptr when empty.
  Runtime* runtime() const { return owner_; }

  // Frees the memory now (if any) and leaves the buffer empty.
  void Reset();

 private:
  friend class Runtime;
  DeviceBuffer(Runtime* owner, void* data, size_t size_bytes)
      : owner_(owner), data_(data), size_bytes_(size_bytes) {}

  Runtime* owner_ = nullptr;
  void* data_ = nullptr;
  size_t size_bytes_ = 0;
};

}  // namespace kvtier::gpu
