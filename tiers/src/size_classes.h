// What the leaf-first eviction policies (leaf_first_lru.cc, s3fifo.cc) share:
// their per-size-class state found by slot size, and PickVictim's choice
// among classes.
#pragma once

#include <cstdint>
#include <optional>

#include "kvtier/tiers/eviction_policy.h"

namespace kvtier::size_classes {

// The index in `classes` (each with a `size`) of the class of `size`, added
// when new.
template <typename Classes>
uint16_t IndexOf(Classes& classes, uint64_t size) {
  for (uint16_t c = 0; c < classes.size(); ++c) {
    if (classes[c].size == size) return c;
  }
  classes.emplace_back().size = size;
  return static_cast<uint16_t>(classes.size() - 1);
}

// PickVictim over classes: `pick(c)` of the class of `size_class`, or with
// kAnyClass the least recent (smallest `stamp`) of every class's pick.
template <typename Classes, typename Pick, typename Stamp>
std::optional<uint32_t> PickVictim(const Classes& classes, uint64_t size_class, Pick pick,
                                   Stamp stamp) {
  if (size_class != EvictionPolicy::kAnyClass) {
    for (uint16_t c = 0; c < classes.size(); ++c) {
      if (classes[c].size == size_class) return pick(c);
    }
    return std::nullopt;
  }
  std::optional<uint32_t> oldest;
  for (uint16_t c = 0; c < classes.size(); ++c) {
    const std::optional<uint32_t> v = pick(c);
    // Stamps wrap: a chunk unused for over 2^31 accesses may compare as recent, which
    // only changes which class gives the victim.
    if (v && (!oldest || static_cast<int32_t>(stamp(*v) - stamp(*oldest)) < 0)) oldest = v;
  }
  return oldest;
}

}  // namespace kvtier::size_classes
