#include "kvtier/tiers/slot_tier.h"

namespace kvtier {

SlotTier::SlotTier(uint64_t capacity_bytes, std::unique_ptr<EvictionPolicy> policy)
    : allocator_(capacity_bytes),
      policy_(policy ? std::move(policy) : NewLeafFirstLruPolicy()) {}

uint32_t SlotTier::AddNamespace(uint64_t slot_bytes) {
  ns_slot_bytes_.push_back(slot_bytes);
  ns_chunks_.push_back(0);
  return static_cast<uint32_t>(ns_slot_bytes_.size() - 1);
}

std::optional<uint64_t> SlotTier::AllocateSlot(uint32_t ns_index) {
  const uint64_t size = ns_slot_bytes_[ns_index];
  for (;;) {
    if (auto offset = allocator_.Allocate(size)) return offset;
    // A victim of the same size frees exactly one slot; otherwise evict by LRU
    // order whatever is evictable until the freed extents coalesce. Chunks
    // held for a write go last.
    if (EvictOne(size, true) || EvictOne(0, true) || EvictOne(size, false) ||
        EvictOne(0, false)) {
      continue;
    }
    return std::nullopt;
  }
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
  ChunkEntry e;
  e.key = key;
  e.parent = parent;
  e.slot_offset = slot_offset;
  e.ns_index = ns_index;
  uint32_t handle = index_.Insert(e);
  if (parent_handle != ChunkIndex::kNone) ++index_.Get(parent_handle).resident_children;
  policy_->OnInsert(handle);
  ++ns_chunks_[ns_index];
  return handle;
}

bool SlotTier::EvictOne(uint64_t same_size, bool spare_held) {
  auto victim = policy_->PickVictim([&](uint32_t h) {
    const ChunkEntry& e = index_.Get(h);
    return e.leases == 0 && e.resident_children == 0 && (!spare_held || e.write_holds == 0) &&
           (same_size == 0 || ns_slot_bytes_[e.ns_index] == same_size);
  });
  if (!victim) return false;
  if (on_evict_) on_evict_(*victim);
  Remove(*victim);
  ++counters_.evictions;
  return true;
}

void SlotTier::Remove(uint32_t handle) {
  const ChunkEntry e = index_.Get(handle);
  policy_->OnRemove(handle);
  uint32_t parent_handle = index_.Find(e.parent);
  if (parent_handle != ChunkIndex::kNone) --index_.Get(parent_handle).resident_children;
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
    const ChunkEntry& e = index_.Get(h);
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
