#include "kvtier/gpu/device_buffer.h"

#include <utility>

#include "kvtier/gpu/runtime.h"

namespace kvtier::gpu {

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      size_bytes_(std::exchange(other.size_bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    owner_ = std::exchange(other.owner_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_bytes_ = std::exchange(other.size_bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::Reset() {
  if (data_ != nullptr) {
    owner_->FreeImpl(data_);
    owner_->HandleReleased();
  }
  owner_ = nullptr;
  data_ = nullptr;
  size_bytes_ = 0;
}

}  // namespace kvtier::gpu
