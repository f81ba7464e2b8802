#include "kvtier/tiers/slot_tier.h"

#include <algorithm>
#include <new>
#include <stdexcept>

#include "kvtier/slot_image.h"

namespace kvtier {

SlotTier::SlotTier(uint64_t capacity_bytes, std::unique_ptr<EvictionPolicy> policy)
    : allocator_(capacity_bytes), policy_(policy ? std::move(policy) : NewLeafFirstLruPolicy()) {
  // The most chunks the tier can hold: one per smallest slot. About 88 bytes
  // of address space per 4 KiB of tier (1/47), resident only as chunks
  // arrive. Only an optimisation: where the address space is refused (a huge
  // tier, strict overcommit) the arrays grow as they used to.
  const size_t max_chunks = capacity_bytes / kSlotAlignment;
  try {
    index_.ReserveEntries(max_chunks);
    policy_->Reserve(max_chunks);
    stored_s_.reserve(max_chunks);
  } catch (const std::bad_alloc&) {
  } catch (const std::length_error&) {
  }
}

uint32_t SlotTier::AddNamespace(uint64_t slot_bytes) {
  ns_slot_bytes_.push_back(slot_bytes);
  ns_chunks_.push_back(0);
  ns_roots_.emplace_back();
  return static_cast<uint32_t>(ns_slot_bytes_.size() - 1);
}

std::optional<uint64_t> SlotTier::AllocateSlot(uint32_t ns_index, size_t room_for) {
  const uint64_t size = ns_slot_bytes_[ns_index];
  for (const bool spare_held : {true, false}) {  // chunks held for a write go last
    for (;;) {
      if (auto offset = allocator_.Allocate(size)) return offset;
      // A victim of the same size frees exactly one slot.
      if (!EvictOne(size, spare_held)) break;
    }
    if (EvictWindows(size, spare_held, std::max<size_t>(room_for, 1))) {
      return allocator_.Allocate(size);
    }
  }
  return std::nullopt;
}

bool SlotTier::EvictWindows(uint64_t size, bool spare_held, size_t windows) {
  // A chunk can go with its descendants here (deepest first, so no orphan is left) when
  // none of them is leased or (with `spare_held`) held for a write. An inner chunk of a
  // prefix chain has a resident child, so without this an arena full of one size's chains
  // had no window for another size at all.
  const std::vector<uint32_t> deepest_first =
      index_.SubtreesDeepestFirst([](uint32_t) { return true; });
  struct Subtree {
    bool blocked = false;
    uint64_t bytes = 0;  // its own and its descendants'
  };
  std::vector<Subtree> subtree(index_.handle_bound());
  for (uint32_t h : deepest_first) {  // children before parents
    const SlotEntry& e = index_.Get(h);
    Subtree& t = subtree[h];
    t.blocked |= e.leases != 0 || (spare_held && e.write_holds != 0);
    t.bytes += ns_slot_bytes_[e.ns_index];
    if (const uint32_t p = e.parent; p != SlotEntry::kNoParent && p != h) {
      subtree[p].blocked |= t.blocked;
      subtree[p].bytes += t.bytes;
    }
  }
  struct Segment {
    uint64_t offset, len;
    uint64_t bytes;   // evicted when it heads a window: its subtree's
    uint32_t handle;  // kNone: a free extent
    bool usable;      // free, or a chunk that can go with its descendants
  };
  std::vector<Segment> segments;
  allocator_.ForEachFreeExtent([&](uint64_t offset, uint64_t len) {
    segments.push_back({offset, len, 0, ChunkIndex::kNone, true});
  });
  for (uint32_t h : deepest_first) {
    const SlotEntry& e = index_.Get(h);
    segments.push_back(
        {e.slot_offset, ns_slot_bytes_[e.ns_index], subtree[h].bytes, h, !subtree[h].blocked});
  }
  std::sort(segments.begin(), segments.end(),
            [](const Segment& a, const Segment& b) { return a.offset < b.offset; });
  // A window's cost is the bytes it evicts: its first segment's subtree, plus each later
  // segment's subtree unless that segment's parent is the segment just before it (a
  // prompt's chunks are allocated in order, so a chain's tail is counted once).
  // prefix[k]: the sum of those later-segment costs over segments 0..k-1.
  std::vector<uint64_t> prefix(segments.size() + 1, 0);
  for (size_t i = 0; i < segments.size(); ++i) {
    const Segment& s = segments[i];
    const bool under_previous = i > 0 && s.handle != ChunkIndex::kNone &&
                                segments[i - 1].handle != ChunkIndex::kNone &&
                                segments[i - 1].offset + segments[i - 1].len == s.offset &&
                                index_.Get(s.handle).parent == segments[i - 1].handle;
    prefix[i + 1] = prefix[i] + (under_previous ? 0 : s.bytes);
  }
  // Per last segment, the shortest run of adjacent usable segments ending there that holds
  // `size` bytes (a gap between segments is a reserved slot).
  struct Window {
    uint64_t cost;
    size_t first, last;
  };
  std::vector<Window> candidates;
  size_t first = 0;
  uint64_t len = 0;
  for (size_t last = 0; last < segments.size(); ++last) {
    const Segment& s = segments[last];
    const bool adjacent =
        last == 0 || segments[last - 1].offset + segments[last - 1].len == s.offset;
    if (!s.usable || (last > first && !adjacent)) {
      first = s.usable ? last : last + 1;
      len = 0;
      if (!s.usable) continue;
    }
    len += s.len;
    while (len - segments[first].len >= size) len -= segments[first++].len;
    if (len >= size) {
      candidates.push_back(
          {segments[first].bytes + prefix[last + 1] - prefix[first + 1], first, last});
    }
  }
  // The `windows` cheapest that do not overlap. Cost 0: Allocate would have fit.
  std::sort(candidates.begin(), candidates.end(),
            [](const Window& a, const Window& b) { return a.cost < b.cost; });
  std::vector<bool> taken(segments.size()), in_window(index_.handle_bound());
  size_t picked = 0;
  for (const Window& w : candidates) {
    if (picked == windows || w.cost == 0) break;
    if (std::any_of(taken.begin() + w.first, taken.begin() + w.last + 1,
                    [](bool t) { return t; })) {
      continue;
    }
    std::fill(taken.begin() + w.first, taken.begin() + w.last + 1, true);
    for (size_t i = w.first; i <= w.last; ++i) {
      if (segments[i].handle != ChunkIndex::kNone) in_window[segments[i].handle] = true;
    }
    ++picked;
  }
  if (picked == 0) return false;
  for (uint32_t h : index_.SubtreesDeepestFirst([&](uint32_t h) { return in_window[h]; })) {
    Evict(h);
  }
  return true;
}

void SlotTier::FreeSlot(uint32_t ns_index, uint64_t slot_offset) {
  allocator_.Free(slot_offset, ns_slot_bytes_[ns_index]);
}

uint32_t SlotTier::Insert(const ChunkKey& key, const ChunkKey& parent, const ChunkKey& ns_root,
                          uint32_t ns_index, uint64_t slot_offset) {
  if (index_.Find(key) != ChunkIndex::kNone) return ChunkIndex::kNone;
  uint32_t parent_handle = ChunkIndex::kNone;
  if (parent != ns_root) {
    parent_handle = index_.Find(parent);
    if (parent_handle == ChunkIndex::kNone) return ChunkIndex::kNone;
    if (index_.Get(parent_handle).ns_index != ns_index) return ChunkIndex::kNone;  // a graft
  }
  SlotEntry e;
  e.key = key;
  e.parent = parent_handle;
  e.slot_offset = slot_offset;
  e.ns_index = ns_index;
  if (parent_handle == SlotEntry::kNoParent) ns_roots_[ns_index] = ns_root;
  uint32_t handle = index_.Insert(e);
  if (handle >= stored_s_.size()) stored_s_.resize(handle + 1);
  stored_s_[handle] = static_cast<uint32_t>(
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - created_)
          .count());
  if (parent_handle != ChunkIndex::kNone) ++index_.Get(parent_handle).resident_children;
  policy_->OnInsert(handle, ns_slot_bytes_[ns_index], key.lo);
  ++ns_chunks_[ns_index];
  if (on_residency_) on_residency_(handle, true);
  return handle;
}

bool SlotTier::EvictOne(uint64_t same_size, bool spare_held) {
  auto victim = policy_->PickVictim(same_size, /*take_held=*/!spare_held, [&](uint32_t h) {
    ++counters_.victim_checks;
    const SlotEntry& e = index_.Get(h);
    if (e.leases != 0 || e.resident_children != 0) return EvictionPolicy::Verdict::kBlocked;
    return e.write_holds != 0 ? EvictionPolicy::Verdict::kHeld : EvictionPolicy::Verdict::kEvict;
  });
  if (!victim) return false;
  Evict(*victim);
  return true;
}

void SlotTier::Evict(uint32_t handle) {
  if (on_evict_) on_evict_(handle);
  Remove(handle);
  ++counters_.evictions;
}

uint64_t SlotTier::AgeSeconds(uint32_t handle) const {
  const auto now =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - created_);
  return static_cast<uint64_t>(now.count()) - stored_s_[handle];
}

void SlotTier::Remove(uint32_t handle) {
  if (on_residency_) on_residency_(handle, false);
  const SlotEntry e = index_.Get(handle);
  policy_->OnRemove(handle);
  if (const uint32_t p = e.parent; p != SlotEntry::kNoParent) {
    if (--index_.Get(p).resident_children == 0) policy_->OnUnblocked(p);
  }
  index_.Erase(handle);
  allocator_.Free(e.slot_offset, ns_slot_bytes_[e.ns_index]);
  --ns_chunks_[e.ns_index];
}

uint64_t SlotTier::unindexed_bytes() const {
  uint64_t chunk_bytes = 0;
  for (size_t i = 0; i < ns_chunks_.size(); ++i) chunk_bytes += ns_chunks_[i] * ns_slot_bytes_[i];
  return allocator_.used_bytes() - chunk_bytes;
}

SubtreeRemoval SlotTier::RemoveSubtrees(const std::function<bool(uint32_t)>& pick,
                                        const std::function<void(uint32_t)>& on_remove) {
  SubtreeRemoval tally;
  for (uint32_t h : index_.SubtreesDeepestFirst(pick)) {
    const SlotEntry& e = index_.Get(h);
    if (e.leases != 0 || e.resident_children != 0) {
      ++tally.kept;
      continue;
    }
    on_remove(h);
    Remove(h);
    ++tally.removed;
  }
  return tally;
}

}  // namespace kvtier
