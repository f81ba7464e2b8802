// CacheCore's admin listing (kvtierctl ls): which chunks of a namespace, or of
// a prompt's prefix, are cached, in which tiers, and how used they are.
#include <optional>
#include <unordered_set>

#include "kvtier/daemon/cache_core.h"
#include "request_checks.h"

namespace kvtier {

Status CacheCore::ListChunks(const core::ListChunksRequest& req, core::ListChunksResponse* resp) {
  const std::optional<NamespaceId> ns_id = ChunkKey::FromWire(req.namespace_id);
  if (!ns_id) {
    return Status::InvalidArgument("namespace_id is " + std::to_string(req.namespace_id.size()) +
                                   " bytes, not 16");
  }
  if (req.limit > core::kMaxListedChunks) {
    return Status::InvalidArgument("limit " + std::to_string(req.limit) + " is more than " +
                                   std::to_string(core::kMaxListedChunks));
  }
  const size_t limit = req.limit == 0 ? core::kMaxListedChunks : req.limit;
  auto tokens = request_checks::PromptTokens(req.tokens, options_.max_prompt_tokens);
  if (!tokens.ok()) return tokens.status();

  std::lock_guard lock(mu_);
  const NamespaceState* live = nullptr;
  if (auto it = ns_by_id_.find(*ns_id); it != ns_by_id_.end()) live = it->second;
  // A chunk's listing from the tiers that hold it; false when none does.
  auto describe = [&](const ChunkKey& key, core::ChunkListing* c) {
    c->key = key;
    if (const uint32_t h = dram_->Find(key); h != ChunkIndex::kNone) {
      const SlotEntry& e = dram_->Get(h);
      c->in_dram = true;
      c->slot_bytes = dram_->slot_bytes(e.ns_index);
      c->age_s = dram_->AgeSeconds(h);
      c->hits = e.hits;
      c->pinned = e.leases != 0;
    }
    if (hbm_) {
      if (const uint32_t h = hbm_->Find(key); h != ChunkIndex::kNone) {
        c->in_hbm = true;
        c->pinned = c->pinned || hbm_->Get(h).leases != 0;
        if (!c->age_s) c->age_s = hbm_->AgeSeconds(h);
      }
    }
    if (nvme_) {
      if (auto info = nvme_->Info(key)) {
        c->in_nvme = true;
        c->pinned = c->pinned || info->pinned;
        if (c->slot_bytes == 0) c->slot_bytes = info->slot_bytes;
      }
    }
    if (live != nullptr) c->payload_bytes = live->layout.payload_bytes;
    return c->in_dram || c->in_hbm || c->in_nvme;
  };
  auto add = [&](const ChunkKey& key) {
    core::ChunkListing c;
    if (!describe(key, &c)) return;
    if (resp->chunks.size() < limit) {
      resp->chunks.push_back(std::move(c));
    } else {
      ++resp->left_out;
    }
  };

  if (!tokens->empty()) {  // a prompt's prefix: its chunks found, in order
    auto keys =
        request_checks::PromptKeys(live, *ns_id, *tokens, "list the whole namespace instead");
    if (!keys.ok()) return keys.status();
    for (const ChunkKey& key : *keys) add(key);
    return Status::Ok();
  }
  // The whole namespace: DRAM (with its HBM copies), then what is only on NVMe.
  std::unordered_set<ChunkKey, ChunkKeyHash> seen;
  if (live != nullptr) {
    dram_->ForEachChunk([&](uint32_t h) {
      const SlotEntry& e = dram_->Get(h);
      if (e.ns_index != live->ns_index) return;
      seen.insert(e.key);
      add(e.key);
    });
  }
  bool on_nvme = false;
  if (nvme_) {
    std::vector<ChunkKey> nvme_only;
    nvme_->VisitChunks([&](const NvmeChunkInfo& info) {
      if (info.ns != *ns_id) return true;
      on_nvme = true;
      if (!seen.contains(info.key)) nvme_only.push_back(info.key);
      return true;
    });
    for (const ChunkKey& key : nvme_only) add(key);  // after the scan: Info locks the tier
  }
  if (live == nullptr && !on_nvme) {
    return Status::NotFound("namespace " + ns_id->ToHex() +
                            " has no cached chunk and is not open in this daemon (see "
                            "`kvtierctl namespaces`)");
  }
  return Status::Ok();
}

}  // namespace kvtier
