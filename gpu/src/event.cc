#include "kvtier/gpu/event.h"

#include <utility>

#include "kvtier/gpu/runtime.h"

namespace kvtier::gpu {

Event::Event(Event&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)),
      handle_(std::exchange(other.handle_, nullptr)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    Reset();
    owner_ = std::exchange(other.owner_, nullptr);
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

void Event::Reset() {
  if (handle_ != nullptr) {
    owner_->DestroyEventImpl(handle_);
    owner_->HandleReleased();
  }
  owner_ = nullptr;
  handle_ = nullptr;
}

}  // namespace kvtier::gpu
