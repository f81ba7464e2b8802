// Stream: RAII ownership of one in-order work queue made by a Runtime.
#pragma once

namespace kvtier::gpu {

class Runtime;

// An in-order queue of device work (CUDA: a non-blocking cudaStream_t; host backend: a
// worker thread). Work queued on one stream runs in queue order; work on different streams
// is unordered unless joined with Runtime::StreamWaitEvent.
//
// Destruction: CUDA returns at once and queued work still completes; the host backend
// blocks until queued work has run. REQUIRES: the Runtime that made it outlives it.
// Thread-safety: the handle is not thread-safe (move/Reset); enqueueing work onto one
// stream from several threads through the Runtime is safe, in an unspecified order.
class Stream {
 public:
  Stream() = default;  // Empty: valid() == false.
  ~Stream() { Reset(); }
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  bool valid() const { return handle_ != nullptr; }
  // CUDA backend: the cudaStream_t, for launching the caller's own kernels on it.
  // Host backend: an opaque pointer. nullptr when empty.
  void* native_handle() const { return handle_; }
  Runtime* runtime() const { return owner_; }

  // Destroys the stream now (see class comment) and leaves the handle empty.
  void Reset();

 private:
  friend class Runtime;
  Stream(Runtime* owner, void* handle) : owner_(owner), handle_(handle) {}

  Runtime* owner_ = nullptr;
  void* handle_ = nullptr;
};

}  // namespace kvtier::gpu
