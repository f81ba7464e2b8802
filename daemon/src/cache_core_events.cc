// CacheCore's KV events: the tiers' residency listeners turned into KvEvents
// (kvtier/kv_event.h says what each field carries).
#include <cstring>

#include "kvtier/daemon/cache_core.h"

namespace kvtier {

void CacheCore::SetKvEventSink(KvEventSink* sink) {
  std::lock_guard lock(mu_);
  events_ = sink;
  if (sink == nullptr) {
    dram_->SetResidencyListener(nullptr);
    if (hbm_) hbm_->SetResidencyListener(nullptr);
    if (nvme_) nvme_->SetResidencyListener(nullptr);
    return;
  }
  // Whatever a subscriber knew of an earlier run is gone from DRAM and HBM.
  KvEvent cleared;
  cleared.type = KvEventType::kAllBlocksCleared;
  sink->Add(std::move(cleared));
  dram_->SetResidencyListener(
      [this](uint32_t h, bool resident) { OnSlotResidency(*dram_, KvMedium::kCpu, h, resident); });
  if (hbm_) {
    hbm_->SetResidencyListener(
        [this](uint32_t h, bool resident) { OnSlotResidency(*hbm_, KvMedium::kGpu, h, resident); });
  }
  if (nvme_) {
    nvme_->SetResidencyListener(
        [this](const ChunkKey& key, const ChunkKey& parent, const NamespaceId& ns,
               std::span<const std::byte> image) { OnNvmeResidency(key, parent, ns, image); });
  }
}

void CacheCore::OnSlotResidency(const SlotTier& tier, KvMedium medium, uint32_t h, bool resident) {
  const SlotEntry& entry = tier.Get(h);
  KvEvent e;
  e.type = resident ? KvEventType::kBlockStored : KvEventType::kBlockRemoved;
  e.medium = medium;
  e.block_hashes.push_back(entry.key);
  if (resident) {
    const CoreNamespace& ns = *namespaces_[entry.ns_index];  // ns_index numbers namespaces_
    e.block_size = ns.spec.chunk_tokens;
    if (const ChunkKey& parent = tier.ParentKey(h); parent != ns.id) e.parent = parent;
    if (ns.spec.engine_keyed) {
      std::lock_guard lock(engine_keyed_mu_);
      engine_keyed_.insert(ns.id);
    } else {
      // HBM holds a subset of DRAM: the tokens come from the DRAM copy's header.
      const uint32_t d = &tier == dram_.get() ? h : dram_->Find(entry.key);
      if (d != ChunkIndex::kNone) {
        const std::byte* slot = dram_->SlotAddress(dram_->Get(d).slot_offset);
        e.token_ids.resize(ns.spec.chunk_tokens);
        std::memcpy(e.token_ids.data(), slot + sizeof(SlotHeader), e.token_ids.size() * 4);
      }
    }
  }
  events_->Add(std::move(e));
}

void CacheCore::OnNvmeResidency(const ChunkKey& key, const ChunkKey& parent, const NamespaceId& ns,
                                std::span<const std::byte> image) {
  KvEvent e;
  e.type = image.empty() ? KvEventType::kBlockRemoved : KvEventType::kBlockStored;
  e.medium = KvMedium::kStorage;
  e.block_hashes.push_back(key);
  if (!image.empty()) {
    SlotHeader header;
    std::memcpy(&header, image.data(), sizeof(header));
    e.block_size = header.num_tokens;
    if (parent != ns) e.parent = parent;
    bool engine_keyed;
    {
      std::lock_guard lock(engine_keyed_mu_);
      engine_keyed = engine_keyed_.count(ns) > 0;
    }
    if (!engine_keyed && image.size() >= sizeof(header) + uint64_t{header.num_tokens} * 4) {
      e.token_ids.resize(header.num_tokens);
      std::memcpy(e.token_ids.data(), image.data() + sizeof(header), e.token_ids.size() * 4);
    }
  }
  events_->Add(std::move(e));
}

}  // namespace kvtier
