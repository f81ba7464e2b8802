// ChunkIndex: chunk key -> where the chunk lives in one tier.
//
// Entries are addressed by small integer handles (stable while the entry
// exists) so that policies and leases can refer to them cheaply. Each key's
// place is an open-addressed table of 4-byte handles (linear probing, at most
// 3/4 full, backward-shift erase), whose keys live in the entries: 5.3-10.7
// bytes per chunk. A std::unordered_map node cost about 56 bytes more per
// chunk. DESIGN.md budgets 256 B per chunk (issue 11: 64 B).
//
// Two entry types: ChunkEntry names its parent by key (the NVMe tier, whose
// parents need not be resident), SlotEntry by handle (the slot tiers, DRAM
// and HBM, where a chunk's parent is always resident: 48 bytes, not 64).
//
// Thread-safety: not thread-safe; the owning tier serializes calls.
#pragma once

#include <cstdint>
#include <functional>
#include <type_traits>
#include <vector>

#include "kvtier/chunk_key.h"

namespace kvtier {

struct ChunkEntry {
  ChunkKey key;
  ChunkKey parent;                 // the namespace id for chunk 0
  uint64_t slot_offset = 0;        // byte offset of the slot image in the tier
  uint32_t ns_index = 0;           // the tier's small namespace number
  uint32_t leases = 0;             // active leases pinning this chunk
  uint32_t resident_children = 0;  // chunks in this tier whose parent is this one
  uint32_t hits = 0;               // lookups that hit it here (saturating)
  uint32_t write_holds = 0;        // pending writes to a lower tier: evicted only as a last resort
};

// A slot tier's entry: as ChunkEntry, with the parent as its handle in the
// same index (kNoParent for chunk 0, whose parent is the namespace root). The
// tier refuses a chunk whose parent is not resident and never removes a chunk
// with a resident child, so the handle stays valid while the child lives.
struct SlotEntry {
  static constexpr uint32_t kNoParent = UINT32_MAX;
  ChunkKey key;
  uint64_t slot_offset = 0;
  uint32_t parent = kNoParent;
  uint32_t ns_index = 0;
  uint32_t leases = 0;
  uint32_t resident_children = 0;
  uint32_t hits = 0;
  uint32_t write_holds = 0;
};
static_assert(sizeof(SlotEntry) == 48, "the index's memory per chunk (BENCHMARKS.md)");

// What an admin eviction did in one tier: chunks removed, and chunks it
// selected but kept because a lease (or a read or copy in flight) pins them
// or one of their descendants.
struct SubtreeRemoval {
  uint64_t removed = 0;
  uint64_t kept = 0;
};

template <typename Entry>
class BasicChunkIndex {
 public:
  static constexpr uint32_t kNone = UINT32_MAX;

  // Handle of `key`, or kNone.
  uint32_t Find(const ChunkKey& key) const {
    if (table_.empty()) return kNone;
    for (size_t i = Home(key);; i = (i + 1) & mask_) {
      const uint32_t h = table_[i];
      if (h == kNone || entries_[h].key == key) return h;
    }
  }
  // Adds `entry`. REQUIRES: Find(entry.key) == kNone.
  uint32_t Insert(const Entry& entry);
  // Removes the entry; its handle may be reused.
  void Erase(uint32_t handle);

  Entry& Get(uint32_t handle) { return entries_[handle]; }
  const Entry& Get(uint32_t handle) const { return entries_[handle]; }
  // The handle of chunk `handle`'s parent here, or kNone (not here, or the root).
  uint32_t ParentOf(uint32_t handle) const {
    if constexpr (std::is_same_v<Entry, SlotEntry>) {
      return entries_[handle].parent;  // kNoParent == kNone
    } else {
      return Find(entries_[handle].parent);
    }
  }
  size_t size() const { return size_; }
  // Every handle is less than this (a size for arrays indexed by handle).
  size_t handle_bound() const { return entries_.size(); }
  // Calls f(handle) for every chunk, in no particular order. `f` must not
  // insert or erase.
  template <typename F>
  void ForEach(F&& f) const {
    for (const uint32_t h : table_) {
      if (h != kNone) f(h);
    }
  }
  void Reserve(size_t num_chunks);
  // Room for `max_chunks` entries without regrowing the entry array: address
  // space only, touched as entries are added. Each regrowth would copy the
  // array and leave the old one to the allocator, which keeps it resident.
  void ReserveEntries(size_t max_chunks) {
    entries_.reserve(max_chunks);
    free_handles_.reserve(max_chunks);
  }

  // The chunks `pick(handle)` selects and every descendant of theirs here,
  // deepest first: each child comes before its parent, the order a leaf-first
  // removal takes (an admin eviction). O(chunks) time and memory.
  std::vector<uint32_t> SubtreesDeepestFirst(const std::function<bool(uint32_t)>& pick) const;

 private:
  // Chunk keys are uniform 128-bit hashes already: their low bits place them.
  size_t Home(const ChunkKey& key) const { return static_cast<size_t>(key.lo) & mask_; }
  // Rebuilds the table with `capacity` positions (a power of two).
  void Rehash(size_t capacity);

  std::vector<uint32_t> table_;  // handles, kNone where empty; a power-of-two size
  size_t mask_ = 0;              // table_.size() - 1
  size_t size_ = 0;
  std::vector<Entry> entries_;
  std::vector<uint32_t> free_handles_;
};

using ChunkIndex = BasicChunkIndex<ChunkEntry>;
using SlotIndex = BasicChunkIndex<SlotEntry>;
static_assert(SlotEntry::kNoParent == ChunkIndex::kNone);

}  // namespace kvtier
