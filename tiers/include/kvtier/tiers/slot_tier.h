// SlotTier: the bookkeeping of a tier whose chunks live in fixed-size slots of
// one memory range: its slot allocator, the index of resident chunks and the
// eviction policy. It owns no memory; DramTier (the shared-memory arena) and
// HbmTier (a device pool) add theirs.
//
// Mechanism only: leases, reservations and sessions live in the daemon, which
// pins chunks here (Pin/Unpin) while clients copy them.
//
// Eviction rule (DESIGN.md): the victim is the least recently used chunk with
// no lease and no resident child, of the needed slot size. When there is none
// (namespaces of several slot sizes), the tier evicts the chunks of the
// smallest window of the arena, made of free space and such chunks only, that
// holds the slot: at most the slot's size plus one chunk on each side, and
// nothing at all when no window exists (pinned chunks and open reservations
// split the arena). Inserting a chunk whose parent is not resident is
// refused, so no orphan is ever reachable.
//
// Thread-safety: not thread-safe; the daemon serializes calls with its mutex.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "kvtier/status.h"
#include "kvtier/tiers/chunk_index.h"
#include "kvtier/tiers/eviction_policy.h"
#include "kvtier/tiers/slot_allocator.h"

namespace kvtier {

struct SlotTierCounters {
  uint64_t evictions = 0;
  // Chunks the victim search looked at (the search's cost: O(1) amortised
  // per eviction, insert and access).
  uint64_t victim_checks = 0;
};

class SlotTier {
 public:
  // A tier of `capacity_bytes` from offset 0. `policy` defaults to leaf-first LRU.
  explicit SlotTier(uint64_t capacity_bytes, std::unique_ptr<EvictionPolicy> policy = nullptr);
  virtual ~SlotTier() = default;
  SlotTier(const SlotTier&) = delete;
  SlotTier& operator=(const SlotTier&) = delete;

  // Registers a namespace whose slots are `slot_bytes`; returns its ns_index
  // (0, 1, 2, ... in registration order).
  uint32_t AddNamespace(uint64_t slot_bytes);
  // Gives namespace number `ns_index` to another namespace with `slot_bytes`.
  // REQUIRES: num_chunks(ns_index) == 0 and no slot of it is allocated.
  void ReuseNamespace(uint32_t ns_index, uint64_t slot_bytes) {
    ns_slot_bytes_[ns_index] = slot_bytes;
  }

  // A free slot for a chunk of namespace `ns_index`, evicting as needed (the
  // eviction rule above; chunks held for a write go last). Returns nullopt
  // when no slot can be made, having evicted nothing for it. `room_for`: how
  // many slots of this size the caller is about to ask for (the rest of a
  // request); when room must come from chunks of other sizes, one pass over
  // the index makes room for up to that many (the pass is O(chunks log chunks)).
  std::optional<uint64_t> AllocateSlot(uint32_t ns_index, size_t room_for = 1);
  // Returns a slot that was allocated but never inserted (abort, expiry, drop).
  void FreeSlot(uint32_t ns_index, uint64_t slot_offset);

  // Makes a committed chunk visible. Returns kNone (and inserts nothing) when
  // `key` is already resident, or when `parent` is neither `ns_root` nor a
  // resident chunk of the same namespace.
  uint32_t Insert(const ChunkKey& key, const ChunkKey& parent, const ChunkKey& ns_root,
                  uint32_t ns_index, uint64_t slot_offset);

  uint32_t Find(const ChunkKey& key) const { return index_.Find(key); }
  template <typename F>
  void ForEachChunk(F&& f) const {
    index_.ForEach(std::forward<F>(f));
  }
  const SlotEntry& Get(uint32_t handle) const { return index_.Get(handle); }
  // The key of chunk `handle`'s parent: a resident chunk's, or for chunk 0 the
  // namespace root it was inserted under.
  const ChunkKey& ParentKey(uint32_t handle) const {
    const SlotEntry& e = index_.Get(handle);
    return e.parent == SlotEntry::kNoParent ? ns_roots_[e.ns_index] : index_.Get(e.parent).key;
  }
  // Seconds since chunk `handle` became resident here (committed, promoted or
  // copied in), on the steady clock, whole seconds. Kept beside the index, 4
  // bytes per handle (the index entry stays 48 bytes).
  uint64_t AgeSeconds(uint32_t handle) const;
  // Marks a chunk as just used.
  void Touch(uint32_t handle) { policy_->OnAccess(handle); }
  // Counts a hit on the chunk; returns the new count (saturates).
  uint32_t AddHit(uint32_t handle) {
    uint32_t& h = index_.Get(handle).hits;
    if (h != UINT32_MAX) ++h;
    return h;
  }
  // Called with each victim just before eviction drops it (its slot still
  // holds its image): under write-back the daemon demotes a DRAM victim to
  // NVMe, and drops its HBM copy (HBM stays a subset of DRAM).
  using EvictionListener = std::function<void(uint32_t handle)>;
  void SetEvictionListener(EvictionListener listener) { on_evict_ = std::move(listener); }
  // Called with each chunk just after Insert makes it resident (`resident`
  // true) and just before it leaves, by eviction or removal (false; its slot
  // still holds its image): the daemon publishes KV events from it. It must
  // not call back into the tier. Default: none.
  using ResidencyListener = std::function<void(uint32_t handle, bool resident)>;
  void SetResidencyListener(ResidencyListener listener) { on_residency_ = std::move(listener); }

  // A chunk waiting for its NVMe write is evicted only when nothing else can
  // be (then its write is skipped). Holds nest.
  void HoldForWrite(uint32_t handle) { ++index_.Get(handle).write_holds; }
  void ReleaseWriteHold(uint32_t handle) {
    if (--index_.Get(handle).write_holds == 0) policy_->OnUnblocked(handle);
  }

  // A pinned chunk is never evicted. Pins nest.
  void Pin(uint32_t handle) {
    if (index_.Get(handle).leases++ == 0) ++num_pinned_;
  }
  void Unpin(uint32_t handle) {
    if (--index_.Get(handle).leases == 0) {
      --num_pinned_;
      policy_->OnUnblocked(handle);
    }
  }

  // Drops a resident chunk now, as eviction would (without the listener).
  // REQUIRES: no lease and no resident child.
  void Remove(uint32_t handle);
  // Admin eviction: removes the chunks `pick(handle)` selects and all their
  // descendants here, children first, keeping those pinned or with a pinned
  // descendant. `on_remove(handle)` runs just before each removal. Not counted
  // as evictions.
  SubtreeRemoval RemoveSubtrees(const std::function<bool(uint32_t)>& pick,
                                const std::function<void(uint32_t)>& on_remove);

  uint64_t capacity_bytes() const { return allocator_.capacity_bytes(); }
  uint64_t used_bytes() const { return allocator_.used_bytes(); }
  uint64_t num_chunks() const { return index_.size(); }
  uint64_t num_chunks(uint32_t ns_index) const { return ns_chunks_[ns_index]; }
  // Resident chunks with at least one pin (0 when no client holds anything).
  uint64_t num_pinned() const { return num_pinned_; }
  // Bytes of allocated slots that hold no resident chunk: reserved, being
  // promoted into, or leaked (0 when no write or promotion is under way).
  uint64_t unindexed_bytes() const;
  uint64_t slot_bytes(uint32_t ns_index) const { return ns_slot_bytes_[ns_index]; }
  const SlotTierCounters& counters() const { return counters_; }

 private:
  // Evicts the least recently used evictable chunk among slots of
  // `same_size` bytes, and (with `spare_held`) not one held for a write;
  // false when none is evictable. O(1) amortised (EvictionPolicy).
  bool EvictOne(uint64_t same_size, bool spare_held);
  // Evicts the chunks of up to `windows` disjoint windows of the arena, each
  // holding `size` bytes, cheapest first in evicted bytes, made only of free
  // extents and chunks that can go with all their descendants here (none
  // leased, nor held for a write with `spare_held`); those descendants go too,
  // deepest first. False, evicting nothing, when there is no such window.
  bool EvictWindows(uint64_t size, bool spare_held, size_t windows);
  // REQUIRES: evictable. Tells the listener, removes it, counts the eviction.
  void Evict(uint32_t handle);

  SlotAllocator allocator_;
  SlotIndex index_;
  std::unique_ptr<EvictionPolicy> policy_;
  std::vector<uint64_t> ns_slot_bytes_;
  std::vector<uint64_t> ns_chunks_;
  std::vector<ChunkKey> ns_roots_;  // per ns_index: the root its chunk 0s were inserted under
  SlotTierCounters counters_;
  uint64_t num_pinned_ = 0;
  // Per handle: when it was inserted, in whole seconds from created_.
  std::vector<uint32_t> stored_s_;
  const std::chrono::steady_clock::time_point created_ = std::chrono::steady_clock::now();
  EvictionListener on_evict_;
  ResidencyListener on_residency_;
};

}  // namespace kvtier
