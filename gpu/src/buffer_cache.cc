#include "kvtier/gpu/buffer_cache.h"

#include <bit>

#include "kvtier/gpu/runtime.h"

namespace kvtier::gpu {

ScratchBuffer& ScratchBuffer::operator=(ScratchBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    buffer_ = std::move(other.buffer_);
    home_ = other.home_;
    other.home_ = nullptr;
  }
  return *this;
}

void ScratchBuffer::Reset() {
  if (home_ != nullptr && !buffer_.empty()) home_->Give(std::move(buffer_));
  buffer_.Reset();
  home_ = nullptr;
}

GpuStatus BufferCache::Take(size_t bytes, ScratchBuffer* out) {
  if (out == nullptr) return GpuStatus::InvalidArgument("BufferCache::Take: out is null");
  if (bytes == 0) return GpuStatus::InvalidArgument("BufferCache::Take: bytes is 0");
  {
    std::lock_guard lock(mu_);
    auto it = idle_.lower_bound(bytes);
    if (it != idle_.end() && it->first / 2 <= bytes) {
      *out = ScratchBuffer(std::move(it->second), this);
      idle_bytes_ -= it->first;
      idle_.erase(it);
      return GpuStatus::Ok();
    }
  }
  const size_t rounded = std::bit_ceil(std::max<size_t>(bytes, 4096));
  DeviceBuffer fresh;
  if (GpuStatus s = runtime_.Allocate(rounded, &fresh); !s.ok()) return s;
  *out = ScratchBuffer(std::move(fresh), this);
  return GpuStatus::Ok();
}

size_t BufferCache::idle_bytes() const {
  std::lock_guard lock(mu_);
  return idle_bytes_;
}

void BufferCache::Give(DeviceBuffer buffer) {
  const size_t size = buffer.size_bytes();
  std::lock_guard lock(mu_);
  if (idle_bytes_ + size > max_idle_bytes_) return;  // `buffer` is freed here
  idle_bytes_ += size;
  idle_.emplace(size, std::move(buffer));
}

}  // namespace kvtier::gpu
