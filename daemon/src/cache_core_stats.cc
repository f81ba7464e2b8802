// CacheCore's counters: the token hit rate, once per engine request, and Stats.
#include <algorithm>

#include "kvtier/daemon/cache_core.h"
#include "kvtier/proto/convert.h"

namespace kvtier {
namespace {

// The figures every slot tier (DRAM, HBM) reports the same way.
void FillSlotTierStats(const char* name, const SlotTier& tier, uint64_t smallest_slot,
                       v1::TierStats* t) {
  t->set_name(name);
  t->set_capacity_bytes(tier.capacity_bytes());
  t->set_used_bytes(tier.used_bytes());
  t->set_capacity_chunks(smallest_slot == 0 ? 0 : tier.capacity_bytes() / smallest_slot);
  t->set_chunks(tier.num_chunks());
  t->set_evictions(tier.counters().evictions);
  t->set_pinned_chunks(tier.num_pinned());
  t->set_uncommitted_bytes(tier.unindexed_bytes());
}

}  // namespace

CacheCore::LeaseCredit CacheCore::CountRequest(const LookupTally& t, const NamespaceState& ns,
                                               const std::vector<uint32_t>& hits) {
  ++counters_.lookups;
  CountPrompt(t.request, t.prompt_tokens, t.num_keys);
  // Only leased chunks are served; each chunk of a request counts once, for
  // the tier it was in when looked up (HBM copies are in DRAM too).
  LeaseCredit c;
  if (!t.acquire || hits.empty()) return c;
  const RequestLedger::Range fresh = ledger_.Credit(t.request, hits.size());
  c.request = t.request;
  c.from = fresh.from;
  c.to = fresh.to;
  for (size_t i = fresh.from; i < fresh.to; ++i) {
    c.hit_tokens += ns.spec.chunk_tokens;
    if (i >= t.dram_hits || (i < t.prefetched_at.size() && t.prefetched_at[i])) {
      ++c.nvme_hits;
    } else if (hbm_ && hbm_->Find(dram_->Get(hits[i]).key) != ChunkIndex::kNone) {
      ++c.hbm_hits;
    } else {
      ++c.hits;
    }
  }
  counters_.hit_tokens += c.hit_tokens;
  counters_.hits += c.hits;
  counters_.nvme_hits += c.nvme_hits;
  counters_.hbm_hits += c.hbm_hits;
  return c;
}

void CacheCore::CountPrompt(const std::string& request, size_t tokens, size_t full_chunks) {
  if (!ledger_.FirstSight(request, full_chunks)) return;
  counters_.lookup_tokens += tokens;
  counters_.lookup_chunks += full_chunks;
}

void CacheCore::Stats(v1::StatsResponse* resp) {
  std::lock_guard lock(mu_);
  uint64_t smallest_slot = 0;
  for (const auto& ns : namespaces_) {
    if (smallest_slot == 0 || ns->layout.slot_bytes < smallest_slot) {
      smallest_slot = ns->layout.slot_bytes;
    }
  }
  if (hbm_) {
    auto* ht = resp->add_tiers();
    FillSlotTierStats("hbm", *hbm_, smallest_slot, ht);
    ht->set_hits(counters_.hbm_hits);
    ht->set_read_bytes(counters_.hbm_read_bytes);
    ht->set_write_bytes(counters_.hbm_write_bytes);
    ht->set_pending_writes(hbm_queue_.size());
    ht->set_io_errors(counters_.hbm_copy_errors);
  }
  auto* t = resp->add_tiers();
  FillSlotTierStats("dram", *dram_, smallest_slot, t);
  t->set_hits(counters_.hits);
  const uint64_t served = counters_.hits + counters_.nvme_hits + counters_.hbm_hits;
  t->set_misses(counters_.lookup_chunks - std::min(counters_.lookup_chunks, served));
  t->set_read_bytes(counters_.read_bytes);
  t->set_write_bytes(counters_.write_bytes);
  if (nvme_) {
    const NvmeTierCounters n = nvme_->counters();
    auto* nt = resp->add_tiers();
    nt->set_name("nvme");
    nt->set_capacity_bytes(n.capacity_bytes);
    nt->set_used_bytes(n.used_bytes);
    nt->set_capacity_chunks(smallest_slot == 0 ? 0 : n.capacity_bytes / smallest_slot);
    nt->set_chunks(n.chunks);
    nt->set_hits(counters_.nvme_hits);
    nt->set_evictions(n.evictions);
    nt->set_read_bytes(counters_.nvme_read_bytes);
    nt->set_write_bytes(counters_.nvme_write_bytes);
    nt->set_pending_writes(nvme_queue_.size() + demotions_.size() + nvme_in_flight_);
    nt->set_corrupt_reads(n.corrupt_reads);
    nt->set_io_errors(counters_.nvme_io_errors);
    nt->set_skipped_writes(counters_.nvme_skipped_writes);
    nt->set_lost_writes(counters_.nvme_lost_writes);
    nt->set_throttled_writes(counters_.nvme_throttled_writes);
    nt->set_degraded(NvmeDegraded());
  }
  resp->set_lookups(counters_.lookups);
  resp->set_ring_lookups(ring_lookups_.load(std::memory_order_relaxed));
  resp->set_ring_calls(ring_calls_.load(std::memory_order_relaxed));
  resp->set_lookup_tokens(counters_.lookup_tokens);
  resp->set_hit_tokens(counters_.hit_tokens);
  resp->set_sessions(sessions_.size());
  resp->set_active_leases(leases_.size());
  resp->set_active_reservations(reservations_.size());
  resp->set_active_prefetches(static_cast<uint64_t>(
      std::count_if(promotions_.begin(), promotions_.end(),
                    [](const auto& entry) { return !entry.second.on_done; })));
  resp->set_prefetched_chunks(counters_.prefetched_chunks);
  resp->set_session_limited(counters_.session_limited);
  resp->set_uptime_s(static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - started_)
          .count()));
}

void CacheCore::Namespaces(v1::NamespacesResponse* resp) {
  std::lock_guard lock(mu_);
  for (const auto& ns : namespaces_) {
    auto* info = resp->add_namespaces();
    info->set_namespace_id(ns->id.ToBytes());
    *info->mutable_spec() = ToProto(ns->spec);
    info->set_chunks(dram_->num_chunks(ns->ns_index));
    info->set_slot_bytes(ns->layout.slot_bytes);
  }
}

}  // namespace kvtier
