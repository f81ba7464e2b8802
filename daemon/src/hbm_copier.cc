// HbmCopier: copies into the HBM pool on the core's I/O workers, and keeping
// HBM a subset of DRAM.
#include "kvtier/daemon/hbm_copier.h"

#include <spdlog/spdlog.h>

namespace kvtier {

size_t HbmCopier::CountIn(const std::vector<uint32_t>& hits) const {
  size_t n = 0;
  for (uint32_t h : hits) n += hbm_.Find(dram_.Get(h).key) != ChunkIndex::kNone;
  return n;
}

void HbmCopier::Queue(const std::vector<uint32_t>& dram_handles) {
  bool queued = false;
  for (uint32_t h : dram_handles) {  // in prefix order: parents first
    const ChunkKey& key = dram_.Get(h).key;
    if (hbm_.Find(key) != ChunkIndex::kNone || !queued_.insert(key).second) continue;
    queue_.push_back(key);
    queued = true;
  }
  if (queued) work_cv_.notify_one();
}

void HbmCopier::OnDramEviction(uint32_t handle) {
  // The victim has no lease and no child in DRAM, hence none in HBM either
  // (an HBM lease pins the DRAM chunk too; an HBM chunk's parent is in DRAM).
  if (const uint32_t hh = hbm_.Find(dram_.Get(handle).key); hh != ChunkIndex::kNone) {
    hbm_.Remove(hh);
  }
}

void HbmCopier::Step() {
  constexpr size_t kBatch = 8;
  struct Copy {
    uint32_t dram;        // pinned while copied
    uint32_t hbm_parent;  // pinned while copied; kNone for a first chunk
    ChunkKey key, parent, ns_root;
    uint32_t ns_index;
    uint64_t slot_offset;  // in HBM
    SlotLayout layout;
    const std::byte* image;
    uint64_t sequence = 0;  // the HBM copy's own
  };
  std::vector<Copy> plan;
  std::unique_lock lock(mu_);
  std::unordered_set<ChunkKey, ChunkKeyHash> planned;
  while (!queue_.empty() && plan.size() < kBatch) {
    const ChunkKey key = queue_.front();
    queue_.pop_front();
    // A planned key stays in queued_ until inserted, so no other worker copies it too.
    auto skip = [&] { queued_.erase(key); };
    const uint32_t h = dram_.Find(key);
    if (h == ChunkIndex::kNone || hbm_.Find(key) != ChunkIndex::kNone) {
      skip();
      continue;
    }
    const SlotEntry& e = dram_.Get(h);
    const ChunkKey parent = dram_.ParentKey(h);
    const CoreNamespace& ns = *namespaces_[e.ns_index];
    // Its parent must be in HBM (or copied before it in this batch): no orphans there either.
    uint32_t hbm_parent = ChunkIndex::kNone;
    if (parent != ns.id && planned.count(parent) == 0) {
      hbm_parent = hbm_.Find(parent);
      if (hbm_parent == ChunkIndex::kNone) {
        skip();
        continue;
      }
    }
    // The parent is pinned so that making room cannot evict it (it has no HBM child yet).
    if (hbm_parent != ChunkIndex::kNone) hbm_.Pin(hbm_parent);
    auto offset = hbm_.AllocateSlot(e.ns_index);
    if (!offset) {
      if (hbm_parent != ChunkIndex::kNone) hbm_.Unpin(hbm_parent);
      skip();
      continue;  // everything in HBM is leased: the chunk is served from DRAM
    }
    dram_.Pin(h);
    plan.push_back({h, hbm_parent, key, parent, ns.id, e.ns_index, *offset, ns.layout,
                    dram_.SlotAddress(e.slot_offset)});
    planned.insert(key);
  }
  if (plan.empty()) return;
  const uint64_t first_sequence = take_sequences_(plan.size());
  for (size_t k = 0; k < plan.size(); ++k) plan[k].sequence = first_sequence + k;
  lock.unlock();
  std::vector<Status> copied;
  for (const Copy& c : plan) {
    copied.push_back(hbm_.CopyIn(c.slot_offset, c.image, c.layout, c.sequence));
  }
  lock.lock();
  for (size_t k = 0; k < plan.size(); ++k) {
    const Copy& c = plan[k];
    // Parents first: a child whose parent failed is refused by Insert and freed.
    uint32_t hh = ChunkIndex::kNone;
    if (copied[k].ok()) hh = hbm_.Insert(c.key, c.parent, c.ns_root, c.ns_index, c.slot_offset);
    if (hh == ChunkIndex::kNone) {
      hbm_.FreeSlot(c.ns_index, c.slot_offset);
      if (!copied[k].ok()) {
        ++counters_.copy_errors;
        if (auto held_back = copy_log_.Admit()) {
          spdlog::warn("copy of chunk {} into HBM failed: {}{}", c.key.ToHex(),
                       copied[k].ToString(), HeldBack(*held_back));
        }
      }
    } else {
      sequences_[c.slot_offset] = c.sequence;
      counters_.write_bytes += c.layout.payload_bytes;
    }
    if (c.hbm_parent != ChunkIndex::kNone) hbm_.Unpin(c.hbm_parent);
    dram_.Unpin(c.dram);
    queued_.erase(c.key);
  }
}

}  // namespace kvtier
