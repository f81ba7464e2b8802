// SlotAllocator: hands out slots (byte ranges) of an arena.
//
// Free space is a set of extents, coalesced on Free. Allocate takes the best
// fitting extent (the smallest one that is large enough), so with one slot
// size (one namespace, the common case) capacity is exactly
// arena_bytes / slot_bytes and a freed slot is reused as is. With several slot
// sizes, the tier evicts the chunks of one large enough window (SlotTier).
//
// Thread-safety: not thread-safe; the owner serializes calls.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

namespace kvtier {

class SlotAllocator {
 public:
  // `arena_bytes`: bytes available from offset 0.
  explicit SlotAllocator(uint64_t arena_bytes);

  // Offset of a free range of `slot_bytes`, or nullopt when no free extent is
  // large enough. REQUIRES: slot_bytes > 0.
  std::optional<uint64_t> Allocate(uint64_t slot_bytes);

  // Returns a range obtained from Allocate(slot_bytes).
  void Free(uint64_t offset, uint64_t slot_bytes);

  // Rebuilds a fresh allocator's state from the ranges in use, in one pass:
  // `used` is (offset, bytes) sorted by offset. Returns, for each range, whether
  // it was taken (false: it overlaps an earlier one or passes the end).
  // REQUIRES: nothing allocated yet.
  std::vector<bool> ReserveSorted(const std::vector<std::pair<uint64_t, uint64_t>>& used);

  uint64_t capacity_bytes() const { return arena_bytes_; }
  // Bytes of slots currently allocated.
  uint64_t used_bytes() const { return used_bytes_; }
  // Number of free extents (fragmentation; 0 or 1 when nothing was freed).
  size_t num_free_extents() const { return by_offset_.size(); }
  // Calls f(offset, length) for each free extent, in offset order.
  template <typename F>
  void ForEachFreeExtent(F&& f) const {
    for (const auto& [offset, len] : by_offset_) f(offset, len);
  }

 private:
  void Insert(uint64_t offset, uint64_t len);
  void Erase(std::map<uint64_t, uint64_t>::iterator it);

  uint64_t arena_bytes_;
  uint64_t used_bytes_ = 0;
  std::map<uint64_t, uint64_t> by_offset_;           // offset -> length of a free extent
  std::set<std::pair<uint64_t, uint64_t>> by_size_;  // (length, offset), the same extents
};

}  // namespace kvtier
