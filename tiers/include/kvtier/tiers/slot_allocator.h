// SlotAllocator: hands out fixed-size slots of an arena (byte offsets).
//
// Slots of one size form a class. Fresh slots are carved from the arena front
// by a bump pointer; freed slots go to their class's free list and are reused
// only for the same size. With one namespace (the common case) capacity is
// exactly arena_bytes / slot_bytes. Slots are never moved between classes
// (no slab rebalancing yet).
//
// Thread-safety: not thread-safe; the owner serializes calls.
#pragma once

#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

namespace kvtier {

class SlotAllocator {
 public:
  // `arena_bytes`: bytes available from offset 0.
  explicit SlotAllocator(uint64_t arena_bytes) : arena_bytes_(arena_bytes) {}

  // Returns the offset of a free slot of `slot_bytes`, or nullopt when no free
  // slot of that size exists and the untouched remainder is too small.
  // REQUIRES: slot_bytes > 0.
  std::optional<uint64_t> Allocate(uint64_t slot_bytes);

  // Returns a slot obtained from Allocate(slot_bytes).
  void Free(uint64_t offset, uint64_t slot_bytes);

  uint64_t capacity_bytes() const { return arena_bytes_; }
  // Bytes of slots currently allocated.
  uint64_t used_bytes() const { return used_bytes_; }

 private:
  uint64_t arena_bytes_;
  uint64_t bump_ = 0;
  uint64_t used_bytes_ = 0;
  std::unordered_map<uint64_t, std::vector<uint64_t>> free_by_size_;
};

}  // namespace kvtier
