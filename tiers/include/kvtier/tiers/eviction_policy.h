// EvictionPolicy: decides which chunk of a tier to evict (policy apart from
// mechanism: the tier stores bytes, the index records where, this picks).
//
// Chunks are named by the small integer handles of ChunkIndex. The tier tells
// the policy about inserts, accesses and removals, and asks it for a victim
// among the chunks `evictable` accepts (no lease, no resident child, right size).
//
// Thread-safety: not thread-safe; the owning tier serializes calls.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

namespace kvtier {

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  virtual void OnInsert(uint32_t handle) = 0;
  virtual void OnAccess(uint32_t handle) = 0;
  virtual void OnRemove(uint32_t handle) = 0;
  // The chunk to evict next, or nullopt when `evictable` accepts none.
  virtual std::optional<uint32_t> PickVictim(
      const std::function<bool(uint32_t handle)>& evictable) = 0;
};

// Least recently used first, among chunks `evictable` accepts. With the tier's
// predicate "no lease and no resident child" this is DESIGN.md's leaf-first LRU:
// a prefix never loses an inner chunk while its descendants stay.
std::unique_ptr<EvictionPolicy> NewLeafFirstLruPolicy();

}  // namespace kvtier
