#include "kvtier/tiers/slot_allocator.h"

namespace kvtier {

std::optional<uint64_t> SlotAllocator::Allocate(uint64_t slot_bytes) {
  auto it = free_by_size_.find(slot_bytes);
  if (it != free_by_size_.end() && !it->second.empty()) {
    uint64_t offset = it->second.back();
    it->second.pop_back();
    used_bytes_ += slot_bytes;
    return offset;
  }
  if (slot_bytes > arena_bytes_ - bump_) return std::nullopt;
  uint64_t offset = bump_;
  bump_ += slot_bytes;
  used_bytes_ += slot_bytes;
  return offset;
}

void SlotAllocator::Free(uint64_t offset, uint64_t slot_bytes) {
  free_by_size_[slot_bytes].push_back(offset);
  used_bytes_ -= slot_bytes;
}

}  // namespace kvtier
