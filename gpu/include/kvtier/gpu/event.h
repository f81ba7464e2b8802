// Event: RAII ownership of one completion marker made by a Runtime.
#pragma once

namespace kvtier::gpu {

class Runtime;

// A marker recorded into a stream (CUDA: cudaEvent_t with timing disabled; host backend: a
// completion flag with the steady_clock time it fired). Like a CUDA event, it refers to its
// most recent record: queries and waits see that record only, and an event never recorded
// counts as complete.
//
// It may be destroyed while its record is pending or a stream waits on it (as in CUDA).
// REQUIRES: the Runtime that made it outlives it.
// Thread-safety: the handle is not thread-safe (move/Reset); Runtime calls on one event
// from several threads are safe.
class Event {
 public:
  Event() = default;  // Empty: valid() == false.
  ~Event() { Reset(); }
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  bool valid() const { return handle_ != nullptr; }
  // CUDA backend: the cudaEvent_t. Host backend: an opaque pointer. nullptr when empty.
  void* native_handle() const { return handle_; }
  Runtime* runtime() const { return owner_; }

  // Destroys the event now and leaves the handle empty.
  void Reset();

 private:
  friend class Runtime;
  Event(Runtime* owner, void* handle) : owner_(owner), handle_(handle) {}

  Runtime* owner_ = nullptr;
  void* handle_ = nullptr;
};

}  // namespace kvtier::gpu
