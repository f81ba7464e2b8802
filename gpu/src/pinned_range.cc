#include "kvtier/gpu/pinned_range.h"

#include <cstdint>
#include <utility>

#include "kvtier/gpu/runtime.h"

namespace kvtier::gpu {

PinnedRange::PinnedRange(PinnedRange&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)),
      pieces_(std::exchange(other.pieces_, {})),
      size_bytes_(std::exchange(other.size_bytes_, 0)) {}

PinnedRange& PinnedRange::operator=(PinnedRange&& other) noexcept {
  if (this != &other) {
    Reset();
    owner_ = std::exchange(other.owner_, nullptr);
    pieces_ = std::exchange(other.pieces_, {});
    size_bytes_ = std::exchange(other.size_bytes_, 0);
  }
  return *this;
}

bool PinnedRange::Contains(const void* host, size_t bytes) const {
  if (empty()) return false;
  const auto begin = reinterpret_cast<uintptr_t>(data());
  const auto h = reinterpret_cast<uintptr_t>(host);
  return h >= begin && bytes <= size_bytes_ && h - begin <= size_bytes_ - bytes;
}

void PinnedRange::Reset() {
  if (owner_ == nullptr) return;
  for (const PinnedPiece& piece : pieces_) owner_->UnregisterHostPieceImpl(piece.host);
  pieces_.clear();
  size_bytes_ = 0;
  std::exchange(owner_, nullptr)->HandleReleased();
}

}  // namespace kvtier::gpu
