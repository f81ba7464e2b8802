// DramTier: the shared-memory DRAM tier: a SlotTier over the arena (a sealed
// memfd that clients map).
//
// Thread-safety: not thread-safe; the daemon serializes calls with its mutex.
#pragma once

#include <cstdint>
#include <memory>

#include "kvtier/arena.h"
#include "kvtier/status.h"
#include "kvtier/tiers/slot_tier.h"

namespace kvtier {

using DramTierCounters = SlotTierCounters;

class DramTier : public SlotTier {
 public:
  // Creates the arena (`arena_bytes`, a multiple of 4 KiB) with `epoch`.
  // `policy` defaults to leaf-first LRU. Errors: those of Arena::Create.
  static Result<std::unique_ptr<DramTier>> Create(uint64_t arena_bytes, uint64_t epoch,
                                                  std::unique_ptr<EvictionPolicy> policy = nullptr);

  std::byte* SlotAddress(uint64_t slot_offset) const { return arena_->base() + slot_offset; }
  const Arena& arena() const { return *arena_; }

 private:
  DramTier(std::unique_ptr<Arena> arena, std::unique_ptr<EvictionPolicy> policy)
      : SlotTier(arena->bytes(), std::move(policy)), arena_(std::move(arena)) {}

  std::unique_ptr<Arena> arena_;
};

}  // namespace kvtier
