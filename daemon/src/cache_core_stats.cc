// CacheCore's counters: the token hit rate, once per engine request, and Stats.
#include <algorithm>

#include "kvtier/daemon/cache_core.h"

namespace kvtier {
namespace {

// The figures every slot tier (DRAM, HBM) reports the same way.
core::TierStats SlotTierStats(const char* name, const SlotTier& tier, uint64_t smallest_slot) {
  core::TierStats t;
  t.name = name;
  t.capacity_bytes = tier.capacity_bytes();
  t.used_bytes = tier.used_bytes();
  t.capacity_chunks = smallest_slot == 0 ? 0 : tier.capacity_bytes() / smallest_slot;
  t.chunks = tier.num_chunks();
  t.evictions = tier.counters().evictions;
  t.pinned_chunks = tier.num_pinned();
  t.uncommitted_bytes = tier.unindexed_bytes();
  return t;
}

}  // namespace

CacheCore::Leased& CacheCore::Leased::operator+=(const Leased& o) {
  hit_tokens += o.hit_tokens;
  hits += o.hits;
  nvme_hits += o.nvme_hits;
  remote_hits += o.remote_hits;
  hbm_hits += o.hbm_hits;
  read_bytes += o.read_bytes;
  hbm_read_bytes += o.hbm_read_bytes;
  return *this;
}

uint32_t CacheCore::ModelIndex(const std::string& model_id) {
  // Past the bound every new model shares one entry (a client's own model
  // named "_other" becomes it: never two series with one label).
  const std::string& name =
      models_.size() < core::kMaxModelLabels ? model_id : std::string(core::kOtherModels);
  if (auto it = model_index_.find(name); it != model_index_.end()) return it->second;
  models_.emplace_back().model_id = name;
  const auto index = static_cast<uint32_t>(models_.size() - 1);
  model_index_.emplace(name, index);
  return index;
}

void CacheCore::AddTierTokens(core::TierTokens& to, const LeaseCredit& c) {
  to.hbm += c.hbm_hits * c.chunk_tokens;
  to.dram += c.hits * c.chunk_tokens;
  to.nvme += c.nvme_hits * c.chunk_tokens;
  to.remote += c.remote_hits * c.chunk_tokens;
}

CacheCore::Leased CacheCore::LeaseCredit::Hits(uint64_t lo, uint64_t hi) const {
  Leased n;
  for (uint64_t i = std::max(lo, range.from); i < std::min(hi, range.to); ++i) {
    n.hit_tokens += chunk_tokens;
    switch (tier[i - range.from]) {
      case kRemoteHit:
        ++n.remote_hits;
        break;
      case kNvmeHit:
        ++n.nvme_hits;
        break;
      case kHbmHit:
        ++n.hbm_hits;
        break;
      default:
        ++n.hits;
        break;
    }
  }
  return n;
}

CacheCore::LeaseCredit CacheCore::CountRequest(const LookupTally& t, const NamespaceState& ns,
                                               const std::vector<uint32_t>& hits) {
  ++counters_.lookups;
  CountPrompt(t.request, ns, t.prompt_tokens, t.num_keys);
  // Only leased chunks are served; each chunk of a request counts once, for
  // the tier it was in when looked up (HBM copies are in DRAM too).
  LeaseCredit c;
  if (!t.acquire || hits.empty()) return c;
  const RequestLedger::Range fresh = ledger_.Credit(t.request, t.first_chunk, hits.size());
  c.request = t.request;
  c.range = fresh;
  c.model = ns.model;
  c.chunk_tokens = ns.spec.chunk_tokens;
  // Per chunk hits (kvtierctl ls): here, once per request, unless the selective
  // policy counts them already (at every Lookup that finds the chunk in DRAM).
  const bool count_chunk_hits = !nvme_ || options_.nvme_write_policy != NvmeWritePolicy::kSelective;
  for (size_t i = fresh.from; i < fresh.to; ++i) {
    if (count_chunk_hits) dram_->AddHit(hits[i]);
    if (i < t.remote_at.size() && t.remote_at[i]) {
      c.tier.push_back(kRemoteHit);
    } else if (i >= t.dram_hits || (i < t.prefetched_at.size() && t.prefetched_at[i])) {
      c.tier.push_back(kNvmeHit);
    } else if (hbm_ && hbm_->Find(dram_->Get(hits[i]).key) != ChunkIndex::kNone) {
      c.tier.push_back(kHbmHit);
    } else {
      c.tier.push_back(kDramHit);
    }
  }
  static_cast<Leased&>(c) = c.Hits(fresh.from, fresh.to);
  counters_.leased += c;
  AddTierTokens(models_[c.model].hit_tokens, c);
  return c;
}

void CacheCore::CountPrompt(const std::string& request, const NamespaceState& ns, size_t tokens,
                            size_t full_chunks) {
  if (!ledger_.FirstSight(request, full_chunks)) return;
  models_[ns.model].lookup_tokens += tokens;
  counters_.lookup_tokens += tokens;
  counters_.lookup_chunks += full_chunks;
}

core::StatsResponse CacheCore::Stats() {
  core::StatsResponse resp;
  std::lock_guard lock(mu_);
  uint64_t smallest_slot = 0;
  for (const auto& ns : namespaces_) {
    if (smallest_slot == 0 || ns->layout.slot_bytes < smallest_slot) {
      smallest_slot = ns->layout.slot_bytes;
    }
  }
  // Served: every lease's credit less that of the unserved ones.
  const Leased& all = counters_.leased;
  const Leased& lost = counters_.unserved;
  if (hbm_) {
    core::TierStats& ht = resp.tiers.emplace_back(SlotTierStats("hbm", *hbm_, smallest_slot));
    ht.hits = all.hbm_hits - lost.hbm_hits;
    ht.unserved_hits = lost.hbm_hits;
    ht.read_bytes = all.hbm_read_bytes - lost.hbm_read_bytes;
    ht.unserved_read_bytes = lost.hbm_read_bytes;
    ht.write_bytes = hbm_copier_->counters().write_bytes;
    ht.pending_writes = hbm_copier_->Pending();
    ht.io_errors = hbm_copier_->counters().copy_errors;
  }
  core::TierStats& t = resp.tiers.emplace_back(SlotTierStats("dram", *dram_, smallest_slot));
  t.hits = all.hits - lost.hits;
  t.unserved_hits = lost.hits;
  const uint64_t served = (all.hits + all.nvme_hits + all.hbm_hits + all.remote_hits) -
                          (lost.hits + lost.nvme_hits + lost.hbm_hits + lost.remote_hits);
  t.misses = counters_.lookup_chunks - std::min(counters_.lookup_chunks, served);
  t.read_bytes = all.read_bytes - lost.read_bytes;
  t.unserved_read_bytes = lost.read_bytes;
  t.write_bytes = counters_.write_bytes;
  if (nvme_) {
    const NvmeTierCounters n = nvme_->counters();
    core::TierStats& nt = resp.tiers.emplace_back();
    nt.name = "nvme";
    nt.capacity_bytes = n.capacity_bytes;
    nt.used_bytes = n.used_bytes;
    nt.capacity_chunks = smallest_slot == 0 ? 0 : n.capacity_bytes / smallest_slot;
    nt.chunks = n.chunks;
    nt.hits = all.nvme_hits - lost.nvme_hits;
    nt.unserved_hits = lost.nvme_hits;
    nt.evictions = n.evictions;
    nt.read_bytes = promoter_->counters().read_bytes;
    const Destager::Counters& w = destager_->counters();
    nt.write_bytes = w.write_bytes;
    nt.pending_writes = destager_->Pending();
    nt.corrupt_reads = n.corrupt_reads;
    nt.io_errors = nvme_health_->io_errors();
    nt.degraded = NvmeDegraded();
    nt.skipped_writes = w.skipped_writes;
    nt.lost_writes = w.lost_writes;
    nt.throttled_writes = counters_.nvme_throttled_writes;
  }
  if (remote_) {
    const RemoteTierCounters r = remote_->counters();
    core::TierStats& rt = resp.tiers.emplace_back();
    rt.name = "remote";
    rt.hits = all.remote_hits - lost.remote_hits;
    rt.unserved_hits = lost.remote_hits;
    rt.misses = r.misses;
    rt.read_bytes = promoter_->counters().remote_read_bytes;
    rt.write_bytes = r.write_bytes;
    rt.corrupt_reads = r.corrupt_reads;
    rt.io_errors = r.io_errors;
    rt.degraded = remote_->Degraded();
    rt.skipped_writes = r.skipped;
    rt.lost_writes = r.failed_writes;
  }
  resp.lookups = counters_.lookups;
  resp.ring_lookups = ring_lookups_.load(std::memory_order_relaxed);
  resp.ring_calls = ring_calls_.load(std::memory_order_relaxed);
  resp.lookup_tokens = counters_.lookup_tokens;
  resp.lookup_chunks = counters_.lookup_chunks;
  resp.hit_tokens = all.hit_tokens - lost.hit_tokens;
  resp.unserved_hit_tokens = lost.hit_tokens;
  for (const ModelCounters& m : models_) {
    core::ModelStats& out = resp.models.emplace_back();
    out.model_id = m.model_id;
    out.lookup_tokens = m.lookup_tokens;
    out.hit_tokens = {m.hit_tokens.hbm - m.unserved_hit_tokens.hbm,
                      m.hit_tokens.dram - m.unserved_hit_tokens.dram,
                      m.hit_tokens.nvme - m.unserved_hit_tokens.nvme,
                      m.hit_tokens.remote - m.unserved_hit_tokens.remote};
    out.unserved_hit_tokens = m.unserved_hit_tokens;
  }
  resp.prefetches = counters_.prefetches;
  resp.sessions = sessions_.size();
  resp.active_leases = leases_.size();
  resp.active_reservations = reservations_.size();
  resp.active_prefetches = promoter_->ActiveTickets();
  resp.prefetched_chunks = promoter_->counters().prefetched_chunks;
  resp.session_limited = counters_.session_limited;
  resp.uptime_s = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - started_)
          .count());
  return resp;
}

core::Latencies CacheCore::ReadLatencies() const {
  core::Latencies l;
  l.lookup = lookup_latency_.Read();
  l.load = load_latency_.Read();
  l.store = store_latency_.Read();
  l.promotion = promoter_->promotion_latency().Read();
  l.nvme_read = promoter_->nvme_read_latency().Read();
  if (destager_) l.nvme_write = destager_->write_latency().Read();
  return l;
}

std::vector<core::NamespaceInfo> CacheCore::Namespaces() {
  std::vector<core::NamespaceInfo> all;
  std::lock_guard lock(mu_);
  for (const auto& ns : namespaces_) {
    all.push_back({.namespace_id = ns->id,
                   .spec = ns->spec,
                   .chunks = dram_->num_chunks(ns->ns_index),
                   .slot_bytes = ns->layout.slot_bytes});
  }
  return all;
}

}  // namespace kvtier
