#include "kvtier/tiers/slot_allocator.h"

namespace kvtier {

SlotAllocator::SlotAllocator(uint64_t arena_bytes) : arena_bytes_(arena_bytes) {
  if (arena_bytes > 0) Insert(0, arena_bytes);
}

void SlotAllocator::Insert(uint64_t offset, uint64_t len) {
  by_offset_.emplace(offset, len);
  by_size_.emplace(len, offset);
}

void SlotAllocator::Erase(std::map<uint64_t, uint64_t>::iterator it) {
  by_size_.erase({it->second, it->first});
  by_offset_.erase(it);
}

std::optional<uint64_t> SlotAllocator::Allocate(uint64_t slot_bytes) {
  auto fit = by_size_.lower_bound({slot_bytes, 0});
  if (fit == by_size_.end()) return std::nullopt;
  const auto [len, offset] = *fit;
  Erase(by_offset_.find(offset));
  if (len > slot_bytes) Insert(offset + slot_bytes, len - slot_bytes);
  used_bytes_ += slot_bytes;
  return offset;
}

std::vector<bool> SlotAllocator::ReserveSorted(
    const std::vector<std::pair<uint64_t, uint64_t>>& used) {
  std::vector<bool> taken(used.size(), false);
  by_offset_.clear();
  by_size_.clear();
  uint64_t cursor = 0;  // end of the last range taken
  for (size_t i = 0; i < used.size(); ++i) {
    const auto [offset, len] = used[i];
    if (offset < cursor || len == 0 || offset > arena_bytes_ || len > arena_bytes_ - offset) {
      continue;
    }
    if (offset > cursor) Insert(cursor, offset - cursor);
    cursor = offset + len;
    used_bytes_ += len;
    taken[i] = true;
  }
  if (cursor < arena_bytes_) Insert(cursor, arena_bytes_ - cursor);
  return taken;
}

void SlotAllocator::Free(uint64_t offset, uint64_t slot_bytes) {
  used_bytes_ -= slot_bytes;
  uint64_t start = offset, len = slot_bytes;
  auto next = by_offset_.lower_bound(offset);
  if (next != by_offset_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      start = prev->first;
      len += prev->second;
      Erase(prev);
    }
  }
  next = by_offset_.lower_bound(offset);
  if (next != by_offset_.end() && next->first == offset + slot_bytes) {
    len += next->second;
    Erase(next);
  }
  Insert(start, len);
}

}  // namespace kvtier
