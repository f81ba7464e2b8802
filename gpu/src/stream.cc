#include "kvtier/gpu/stream.h"

#include <utility>

#include "kvtier/gpu/runtime.h"

namespace kvtier::gpu {

Stream::Stream(Stream&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)),
      handle_(std::exchange(other.handle_, nullptr)) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    Reset();
    owner_ = std::exchange(other.owner_, nullptr);
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

void Stream::Reset() {
  if (handle_ != nullptr) {
    owner_->DestroyStreamImpl(handle_);
    owner_->HandleReleased();
  }
  owner_ = nullptr;
  handle_ = nullptr;
}

}  // namespace kvtier::gpu
