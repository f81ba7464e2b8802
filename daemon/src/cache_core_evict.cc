// CacheCore's admin eviction: drops a namespace's chunks, a prompt prefix's
// subtree or everything, from every tier, keeping what a lease pins.
#include <optional>
#include <unordered_set>

#include "kvtier/daemon/cache_core.h"
#include "request_checks.h"

namespace kvtier {

Status CacheCore::Evict(const core::EvictRequest& req, core::EvictResponse* resp) {
  const bool has_ns = !req.namespace_id.empty();
  if (req.all == has_ns) {
    return Status::InvalidArgument(
        "give exactly one scope: all, or namespace_id (with tokens for a prompt prefix)");
  }
  if (req.all && !req.tokens.empty()) {
    return Status::InvalidArgument("tokens name a prompt prefix of namespace_id; all takes none");
  }
  std::optional<NamespaceId> ns_id;
  if (has_ns) {
    ns_id = ChunkKey::FromWire(req.namespace_id);
    if (!ns_id) {
      return Status::InvalidArgument("namespace_id is " + std::to_string(req.namespace_id.size()) +
                                     " bytes, not 16");
    }
  }
  auto tokens = request_checks::PromptTokens(req.tokens, options_.max_prompt_tokens);
  if (!tokens.ok()) return tokens.status();

  std::unique_lock lock(mu_);
  const NamespaceState* live = nullptr;
  if (ns_id) {
    if (auto it = ns_by_id_.find(*ns_id); it != ns_by_id_.end()) live = it->second;
  }
  std::optional<ChunkKey> root;  // a prefix: this chunk and its descendants
  if (!tokens->empty()) {
    auto keys = request_checks::PromptKeys(
        live, *ns_id, *tokens, "open it from a client first, or evict the whole namespace");
    if (!keys.ok()) return keys.status();
    root = keys->back();
  }

  // No NVMe write may land what this removes: take none new, wait for those in flight.
  if (destager_) destager_->DrainForEviction(lock);
  promoter_->NoteEviction();  // promotions reading meanwhile drop what they read

  auto pick_key = [&](const ChunkKey& key, const NamespaceId& ns) {
    if (root) return key == *root;
    return !ns_id || ns == *ns_id;
  };
  auto add = [&](const char* tier, SubtreeRemoval r) {
    resp->tiers.push_back({.tier = tier, .removed = r.removed, .kept = r.kept});
  };
  // NVMe first: when its index refuses, nothing has changed yet.
  std::optional<SubtreeRemoval> nvme_removal;
  if (nvme_) {
    Result<SubtreeRemoval> r = nvme_->RemoveSubtrees(pick_key);
    NoteNvmeIo(r.ok());
    if (!r.ok()) {
      return Status::IOError("evicting from NVMe failed, so nothing was evicted: " +
                             r.status().message());
    }
    nvme_removal = *r;
  }
  // HBM before DRAM: an HBM copy pins nothing in DRAM unless it is leased, and
  // a leased HBM copy's DRAM chunk is leased too, so HBM stays a subset of DRAM.
  auto pick_in = [&](const SlotTier& tier) {
    return [&, t = &tier](uint32_t h) {
      const SlotEntry& e = t->Get(h);
      if (ns_id && (live == nullptr || e.ns_index != live->ns_index)) return false;
      return !root || e.key == *root;
    };
  };
  if (hbm_) add("hbm", hbm_->RemoveSubtrees(pick_in(*hbm_), [](uint32_t) {}));
  std::unordered_set<ChunkKey, ChunkKeyHash> removed;
  add("dram", dram_->RemoveSubtrees(pick_in(*dram_),
                                    [&](uint32_t h) { removed.insert(dram_->Get(h).key); }));
  if (nvme_removal) add("nvme", *nvme_removal);

  // Queued writes of removed chunks go too (they would count as skipped).
  if (destager_) destager_->DropQueued(removed, ns_id);
  return Status::Ok();
}

}  // namespace kvtier
