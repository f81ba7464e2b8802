#include "kvtier/daemon/cache_core.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <future>
#include <optional>
#include <random>

#include "kvtier/logging.h"
#include "kvtier/request_id.h"
#include "request_checks.h"

namespace kvtier {
namespace {

using request_checks::PromptTokens;

}  // namespace

Status CacheCoreOptions::Validate() const {
  if (nvme_workers < 1 || nvme_workers > 64) {
    return Status::InvalidArgument("nvme_workers " + std::to_string(nvme_workers) +
                                   " is outside 1..64");
  }
  if (selective_min_hits < 1 || selective_min_hits > 1000000) {
    return Status::InvalidArgument("selective_min_hits " + std::to_string(selective_min_hits) +
                                   " is outside 1..1000000");
  }
  if (dram_bytes < 4096 || dram_bytes % 4096 != 0) {
    return Status::InvalidArgument("dram_bytes " + std::to_string(dram_bytes) +
                                   " is not a positive multiple of 4096");
  }
  // A TTL is the backstop for a client that died without its session breaking;
  // below 100 ms a live client's copy would outlast it, and past a day it
  // would be no backstop (and would overflow the clock's arithmetic).
  constexpr int64_t kMinTtlMs = 100, kMaxTtlMs = 86'400'000;
  for (auto [name, ttl] : {std::pair{"lease_ttl_ms", lease_ttl.count()},
                           std::pair{"reservation_ttl_ms", reservation_ttl.count()}}) {
    if (ttl < kMinTtlMs || ttl > kMaxTtlMs) {
      return Status::InvalidArgument(std::string(name) + " " + std::to_string(ttl) +
                                     " is outside 100..86400000 (100 ms to 24 h)");
    }
  }
  if (!remote.url.empty()) {
    KVTIER_RETURN_IF_ERROR(remote.Validate());
    if (nvme.paths.empty()) {
      return Status::InvalidArgument("remote " + remote.url +
                                     " needs the NVMe tier (--nvme-path): "
                                     "remote writes go with the NVMe writer's batches");
    }
  }
  return Status::Ok();
}

Result<std::unique_ptr<CacheCore>> CacheCore::Create(const CacheCoreOptions& options,
                                                     uint64_t epoch, const Clock& clock) {
  return Create(options, epoch, clock, NvmeOpener([&] { return OpenNvmeTier(options); }));
}

Result<std::unique_ptr<NvmeTier>> CacheCore::OpenNvmeTier(const CacheCoreOptions& options) {
  if (options.nvme.paths.empty()) return std::unique_ptr<NvmeTier>();
  return NvmeTier::Open(options.nvme);
}

Result<std::unique_ptr<CacheCore>> CacheCore::Create(const CacheCoreOptions& options,
                                                     uint64_t epoch, const Clock& clock,
                                                     std::unique_ptr<NvmeTier> nvme) {
  return Create(options, epoch, clock,
                NvmeOpener([&]() -> Result<std::unique_ptr<NvmeTier>> { return std::move(nvme); }));
}

Result<std::unique_ptr<CacheCore>> CacheCore::Create(const CacheCoreOptions& options,
                                                     uint64_t epoch, const Clock& clock,
                                                     const NvmeOpener& open_nvme) {
  KVTIER_RETURN_IF_ERROR(options.Validate());
  auto dram = DramTier::Create(options.dram_bytes, epoch, NewEvictionPolicy(options.dram_eviction));
  if (!dram.ok()) return dram.status();
  std::unique_ptr<CacheCore> core(new CacheCore(options, std::move(dram).value(), clock));
  // HBM before NVMe: a missing GPU is found before slot files are preallocated.
  if (options.hbm.bytes > 0) {
    auto hbm = HbmTier::Create(options.hbm, &core->dram_->arena());
    if (!hbm.ok()) return hbm.status();
    core->hbm_ = std::move(hbm).value();
    core->hbm_copier_ = std::make_unique<HbmCopier>(
        core->mu_, *core->dram_, *core->hbm_, core->namespaces_, core->work_cv_,
        [self = core.get()](size_t n) { return self->TakeSequences(n); });
    if (options.hbm.bytes > options.dram_bytes) {
      spdlog::warn(
          "hbm_bytes {} is more than dram_bytes {}: HBM holds a subset of DRAM, so at "
          "most {} bytes of the pool can be used",
          options.hbm.bytes, options.dram_bytes, options.dram_bytes);
    }
  }
  if (!options.remote.url.empty()) {
    auto remote = RemoteTier::Open(options.remote);
    if (!remote.ok()) return remote.status();
    core->remote_ = std::move(remote).value();
  }
  auto nvme = open_nvme();
  if (!nvme.ok()) return nvme.status();
  if (core->remote_ && !*nvme) {
    return Status::InvalidArgument("remote " + options.remote.url +
                                   " needs the NVMe tier "
                                   "(--nvme-path): remote writes go with the NVMe writer's "
                                   "batches");
  }
  if (*nvme) {
    core->nvme_ = std::move(nvme).value();
    // Above every image NVMe holds: a lapsed reader's sequence can never match
    // an image promoted into its slot (each run's arena starts empty).
    core->next_sequence_ = core->nvme_->max_sequence() + 1;
    core->nvme_health_ = std::make_unique<NvmeHealth>(*core->nvme_);
    core->destager_ = std::make_unique<Destager>(
        Destager::Options{.policy = options.nvme_write_policy,
                          .write_back_buffer_bytes = options.write_back_buffer_bytes,
                          .write_through_wait = options.write_through_wait},
        core->mu_, *core->dram_, *core->nvme_, *core->nvme_health_, core->namespaces_,
        core->remote_.get());
    spdlog::info("NVMe tier: {} chunks indexed at start over {} path(s) of {} bytes",
                 core->nvme_->counters().chunks, options.nvme.paths.size(),
                 options.nvme.bytes_per_path);
  }
  CacheCore* self = core.get();
  core->promoter_ = std::make_unique<Promoter>(
      core->mu_, *core->dram_, core->nvme_.get(), core->nvme_health_.get(), core->hbm_copier_.get(),
      core->remote_.get(), core->work_cv_,
      Promoter::Hooks{
          .live_namespace = [self](const NamespaceId& id) -> CoreNamespace* {
            auto it = self->ns_by_id_.find(id);
            return it == self->ns_by_id_.end() ? nullptr : it->second;
          },
          .token_check = [self](const CoreNamespace& ns, const std::vector<ChunkKey>& keys,
                                std::span<const int32_t> tokens, size_t i,
                                uint32_t h) { return self->TokenCheck(ns, keys, tokens, i, h); },
          .hold = [self](uint64_t session_id, uint64_t bytes) { self->Hold(session_id, bytes); },
          .drop = [self](uint64_t session_id, uint64_t bytes) { self->Drop(session_id, bytes); },
          .take_sequences = [self](size_t n) { return self->TakeSequences(n); },
          // Write-through keeps every DRAM chunk on NVMe too: a remote hit's
          // as well, so that what this node stores past it (NVMe holds no
          // chunk without its parent) reaches its NVMe. Not written back to
          // the remote tier, which has it.
          .remote_promoted =
              [self](uint32_t h) {
                if (self->options_.nvme_write_policy == NvmeWritePolicy::kWriteThrough) {
                  self->destager_->Queue(h, /*to_remote=*/false);
                }
              },
      });
  if (core->remote_) {
    spdlog::info("remote tier: {} (pool of {} connections per node, {} ms timeout)",
                 options.remote.url, options.remote.pool_size, options.remote.timeout.count());
    if (options.remote.mac_key.empty()) {
      spdlog::warn(
          "remote tier: images carry no MAC (no --remote-key-file): whoever can write "
          "to the store can plant KV that kvtierd serves; trust it, or give every "
          "kvtierd of the store the same key file");
    } else {
      spdlog::info("remote tier: images carry a keyed MAC (BLAKE2b-256)");
    }
    if (Status st = core->remote_->CheckAtStart(); !st.ok()) {
      spdlog::warn(
          "remote tier: the store does not answer at start ({}); the tier starts "
          "degraded (misses, no waits) and is probed once a second",
          st.message());
    } else {
      spdlog::info("remote tier: {} answers ({} node(s) own slots)",
                   core->remote_->cluster_mode() ? "the cluster" : "the server",
                   core->remote_->Nodes().size());
    }
  }
  if (core->nvme_ || core->hbm_) {
    core->StartWorkers();
    core->dram_->SetEvictionListener([self](uint32_t h) { self->OnDramEviction(h); });
  }
  // Session, lease and reservation ids start at a random point, so that an id
  // from before a daemon restart is not valid after it.
  std::random_device rd;
  core->next_id_ = ((uint64_t{rd()} << 32 | rd()) >> 2) | (uint64_t{1} << 32);
  return core;
}

CacheCore::~CacheCore() {
  StopWorkers();
  for (const Orphans& o : orphans_) {
    if (o.pidfd >= 0) close(o.pidfd);
  }
}

void CacheCore::OnDramEviction(uint32_t handle) {
  if (destager_ && options_.nvme_write_policy == NvmeWritePolicy::kWriteBack) {
    destager_->Demote(handle, /*count_skips=*/true);
  }
  if (hbm_copier_) hbm_copier_->OnDramEviction(handle);
}

Result<const CacheCore::NamespaceState*> CacheCore::FindNamespace(std::string_view id) const {
  auto key = ChunkKey::FromWire(id);
  if (!key) {
    return Status::InvalidArgument("namespace_id is " + std::to_string(id.size()) +
                                   " bytes, not 16");
  }
  auto it = ns_by_id_.find(*key);
  if (it == ns_by_id_.end()) {
    return Status::NotFound("namespace_id " + key->ToHex() + " is unknown (call OpenNamespace)");
  }
  return static_cast<const NamespaceState*>(it->second);
}

Status CacheCore::OpenNamespace(const core::OpenNamespaceRequest& req,
                                core::OpenNamespaceResponse* resp) {
  if (!req.spec) return Status::InvalidArgument("spec is missing");
  const NamespaceSpec& spec = *req.spec;
  KVTIER_RETURN_IF_ERROR(spec.Validate());
  const SlotLayout layout = SlotLayout::For(spec);
  const NamespaceId id = spec.Digest();
  std::lock_guard lock(mu_);
  KVTIER_RETURN_IF_ERROR(CheckSession(req.session_id));
  auto it = ns_by_id_.find(id);
  if (it == ns_by_id_.end()) {
    if (layout.slot_bytes > dram_->capacity_bytes()) {
      return Status::InvalidArgument("spec: a chunk slot of " + std::to_string(layout.slot_bytes) +
                                     " bytes does not fit in the DRAM arena of " +
                                     std::to_string(dram_->capacity_bytes()) + " bytes");
    }
    NamespaceState* state = nullptr;
    if (namespaces_.size() >= options_.max_namespaces) {
      // Reuse an idle namespace: nothing resident, nothing being written.
      for (auto& ns : namespaces_) {
        if (ns->active_reservations == 0 && dram_->num_chunks(ns->ns_index) == 0) {
          spdlog::info("namespace {} is idle and makes room for {}", ns->id.ToHex(), id.ToHex());
          ns_by_id_.erase(ns->id);
          state = ns.get();
          break;
        }
      }
      if (state == nullptr) {
        spdlog::warn("namespace refused: the daemon holds {} namespaces, none idle ({})",
                     namespaces_.size(), spec.RedactedString());
        return Status::ResourceExhausted("the daemon already holds " +
                                         std::to_string(namespaces_.size()) +
                                         " namespaces with cached chunks");
      }
      dram_->ReuseNamespace(state->ns_index, layout.slot_bytes);
      if (hbm_) hbm_->ReuseNamespace(state->ns_index, layout.slot_bytes);  // a subset: empty too
    } else {
      namespaces_.push_back(std::make_unique<NamespaceState>());
      state = namespaces_.back().get();
      state->ns_index = dram_->AddNamespace(layout.slot_bytes);
      if (hbm_) hbm_->AddNamespace(layout.slot_bytes);  // the same numbering
    }
    if (hbm_ && layout.slot_bytes > hbm_->capacity_bytes()) {
      spdlog::warn(
          "namespace {}: a chunk slot of {} bytes is larger than the HBM pool of {} "
          "bytes; its chunks are served from DRAM",
          id.ToHex(), layout.slot_bytes, hbm_->capacity_bytes());
    }
    state->spec = spec;
    state->id = id;
    state->layout = layout;
    state->active_reservations = 0;
    state->model = ModelIndex(spec.model_id);
    it = ns_by_id_.emplace(id, state).first;
    spdlog::info("namespace {} opened: {}", id.ToHex(), spec.RedactedString());
    if (layout.slot_bytes > options_.SessionMaxBytes()) {
      spdlog::warn(
          "session_max_bytes {} is less than one slot of namespace {} ({} bytes): each "
          "session holds one chunk of it at a time",
          options_.SessionMaxBytes(), id.ToHex(), layout.slot_bytes);
    }
  }
  resp->namespace_id = id;
  resp->payload_bytes = layout.payload_bytes;
  resp->header_bytes = layout.header_bytes;
  resp->slot_bytes = layout.slot_bytes;
  return Status::Ok();
}

Result<CacheCore::NamespaceState> CacheCore::ResolveRequest(uint64_t session_id, uint64_t epoch,
                                                            std::string_view namespace_id) const {
  std::lock_guard lock(mu_);
  KVTIER_RETURN_IF_ERROR(CheckSession(session_id));
  KVTIER_RETURN_IF_ERROR(CheckEpoch(epoch));
  auto found = FindNamespace(namespace_id);
  if (!found.ok()) return found.status();
  return **found;  // a copy: the state may be given to another namespace when idle
}

bool CacheCore::ResidentIs(const NamespaceState& ns, uint32_t h, const ReservedChunk& c) {
  const Status st = VerifySlotHeader(dram_->SlotAddress(dram_->Get(h).slot_offset), ns.layout,
                                     {ns.id, c.key, c.parent, c.tokens},
                                     /*check_header_checksum=*/false);
  if (st.ok()) return true;
  ++counters_.token_check_failures;
  if (auto held_back = collision_log_.Admit()) {
    spdlog::warn("ReserveWrite: chunk {} of namespace {} is held by another chunk: {}{}",
                 c.key.ToHex(), ns.id.ToHex(), st.message(), HeldBack(*held_back));
  }
  return false;
}

bool CacheCore::TokenCheck(const NamespaceState& ns, const std::vector<ChunkKey>& keys,
                           std::span<const int32_t> tokens, size_t i, uint32_t h) {
  const uint32_t ct = ns.spec.chunk_tokens;
  const SlotIdentity id{ns.id, keys[i], ns.spec.ChunkParent(ns.id, keys, i),
                        tokens.subspan(i * ct, ct)};
  const Status st = VerifySlotHeader(dram_->SlotAddress(dram_->Get(h).slot_offset), ns.layout, id,
                                     /*check_header_checksum=*/false);
  if (st.ok()) return true;
  ++counters_.token_check_failures;
  if (auto held_back = collision_log_.Admit()) {
    spdlog::warn("token check failed for chunk {} of namespace {}: {}{}", keys[i].ToHex(),
                 ns.id.ToHex(), st.message(), HeldBack(*held_back));
  }
  return false;
}

std::vector<uint32_t> CacheCore::DramPrefix(const NamespaceState& ns,
                                            const std::vector<ChunkKey>& keys,
                                            std::span<const int32_t> tokens, size_t limit) {
  std::vector<uint32_t> hits;
  hits.reserve(std::min(limit, keys.size()));
  for (size_t i = 0; i < keys.size() && hits.size() < limit; ++i) {
    const uint32_t h = dram_->Find(keys[i]);
    if (h == ChunkIndex::kNone || !TokenCheck(ns, keys, tokens, i, h)) break;
    hits.push_back(h);
  }
  return hits;
}

size_t CacheCore::ContinuationRun(const std::vector<ChunkKey>& keys, size_t from,
                                  size_t limit) const {
  if (!nvme_) return 0;
  // keys[from] in DRAM: the DRAM prefix stopped there because it failed the token check.
  if (from < limit && dram_->Find(keys[from]) != ChunkIndex::kNone) return 0;
  size_t n = 0;
  for (size_t i = from; i < limit; ++i, ++n) {
    if (!nvme_->Contains(keys[i]) && dram_->Find(keys[i]) == ChunkIndex::kNone) break;
  }
  return n;
}

size_t CacheCore::PromotionReach(const std::vector<ChunkKey>& keys, size_t from, size_t limit,
                                 size_t run) const {
  if (!remote_ || remote_->Degraded() || from >= limit) return run;
  if (run == 0 && dram_->Find(keys[from]) != ChunkIndex::kNone) return 0;  // failed its check
  return limit - from;
}

bool CacheCore::ProbeRemote(LookupTally& tally, const NamespaceState& ns,
                            const std::vector<ChunkKey>& keys, std::vector<uint32_t>& hits,
                            size_t run, core::LookupResponse* resp, Done& done) {
  const size_t from = hits.size() + run;
  if (!remote_ || remote_->Degraded() || from >= tally.max_hits ||
      dram_->Find(keys[from]) != ChunkIndex::kNone) {
    return false;
  }
  // The DRAM hits stay pinned while mu_ is dropped, so their handles hold.
  for (uint32_t h : hits) dram_->Pin(h);
  tally.promoted_hits = run;
  remote_probes_.push_back([this, tally, ns, resp, hits, done = std::move(done),
                            tail = std::vector<ChunkKey>(
                                keys.begin() + static_cast<ptrdiff_t>(from),
                                keys.begin() + static_cast<ptrdiff_t>(tally.max_hits))]() mutable {
    const size_t present = remote_->PresentRun(ns.id, tail);
    Status result;
    {
      std::lock_guard relock(mu_);
      result = CheckSession(tally.session_id);
      if (result.ok()) {
        // Remote chunks count in nvme_chunks too (LookupResponse.remote_chunks).
        tally.remote_at.assign(tally.dram_hits + tally.promoted_hits + present, false);
        std::fill(tally.remote_at.end() - static_cast<ptrdiff_t>(present), tally.remote_at.end(),
                  true);
        tally.promoted_hits += present;
        GrantLookup(tally, ns, hits, resp);
      }
      for (uint32_t h : hits) dram_->Unpin(h);
    }
    done(result);
  });
  work_cv_.notify_one();
  return true;
}

size_t CacheCore::LocalRun(const std::vector<ChunkKey>& keys, size_t limit) const {
  size_t n = 0;
  while (n < limit &&
         (dram_->Find(keys[n]) != ChunkIndex::kNone || (nvme_ && nvme_->Contains(keys[n])))) {
    ++n;
  }
  return n;
}

void CacheCore::Lookup(const core::LookupRequest& req, core::LookupResponse* resp, Done done) {
  const auto started = std::chrono::steady_clock::now();
  auto prompt = PromptTokens(req.tokens, options_.max_prompt_tokens);
  if (!prompt.ok()) return done(prompt.status());
  if (Status st = CheckRequestId(req.request_id); !st.ok()) return done(st);
  if (req.prefetch_ticket != 0 && !req.acquire) {
    return done(
        Status::InvalidArgument("prefetch_ticket is set without acquire (a ticket's "
                                "chunks are taken over by a Lookup that leases them)"));
  }
  if (req.adopt_ticket && (req.prefetch_ticket == 0 || req.request_id.empty())) {
    return done(
        Status::InvalidArgument("adopt_ticket is set without a prefetch_ticket and a "
                                "request_id (it takes over another session's Prefetch "
                                "of the same request)"));
  }
  auto resolved = ResolveRequest(req.session_id, req.epoch, req.namespace_id);
  if (!resolved.ok()) return done(resolved.status());
  const NamespaceState ns = *resolved;
  const std::span<const int32_t> all = *prompt;
  // Hash outside the lock: it is the bulk of a long prompt's lookup.
  const std::vector<ChunkKey> keys = ns.spec.ChunkKeys(ns.id, all);
  LookupTally tally;
  tally.started = started;
  tally.session_id = req.session_id;
  tally.acquire = req.acquire;
  tally.hbm = req.hbm && hbm_ != nullptr;
  tally.prompt_tokens = all.size();
  tally.num_keys = keys.size();
  tally.max_hits =
      req.max_chunks == 0 ? keys.size() : std::min<size_t>(keys.size(), req.max_chunks);
  tally.request = RequestLedger::Named(req.request_id);
  tally.first_chunk = req.first_chunk;

  std::unique_lock lock(mu_);
  Status st = CheckSession(req.session_id);  // it may have ended meanwhile
  std::optional<Promoter::Table::iterator> ticket;
  // An adopted ticket still promoting: where its promoted chunks start, they, and which came
  // from the remote tier.
  uint32_t adopted_from = 0;
  std::vector<uint32_t> adopted_ready;
  std::vector<bool> adopted_remote;
  if (st.ok() && req.prefetch_ticket != 0) {
    auto found = req.adopt_ticket
                     ? promoter_->FindRequestTicket(req.prefetch_ticket, tally.request, ns.id)
                     : promoter_->FindTicket(req.prefetch_ticket, req.session_id);
    if (found.ok() && req.adopt_ticket && !(*found)->second.done) {
      // Another session's prefetch still promoting: ended, and this Lookup
      // reads what it had not promoted yet (its worker may still finish a step).
      // What it promoted counts as prefetched, from its tier.
      const Promotion& p = (*found)->second;
      adopted_from = p.dram_at_start;
      adopted_ready = p.ready;
      adopted_remote = p.from_remote;
      ++counters_.prefetches.used_early;
      promoter_->End(*found);
    } else if (found.ok()) {
      ticket = *found;
    } else if (found.status().code() != StatusCode::kNotFound) {  // expired: no error
      st = found.status();
    }
  }
  if (!st.ok()) {
    lock.unlock();
    return done(st);
  }
  if (req.acquire) {  // a lease takes over the ticket's hold (its own session's)
    const bool own = ticket && (*ticket)->second.session_id == req.session_id;
    const size_t allowed = SessionAllowance(req.session_id, ns.layout.slot_bytes,
                                            own ? (*ticket)->second.held_bytes : 0);
    if (allowed < tally.max_hits) {
      tally.max_hits = allowed;
      ++counters_.session_limited;
    }
  }
  std::vector<uint32_t> hits = DramPrefix(ns, keys, all, tally.max_hits);
  tally.dram_hits = hits.size();
  if (!adopted_ready.empty()) {
    MarkPromoted(adopted_from, adopted_ready, adopted_remote, hits, &tally);
  }
  if (nvme_ && options_.nvme_write_policy == NvmeWritePolicy::kSelective) {
    for (uint32_t h : hits) {  // parents are hit at least as often: they go first
      if (dram_->AddHit(h) == options_.selective_min_hits && !nvme_->Contains(dram_->Get(h).key)) {
        destager_->Queue(h);
      }
    }
  }
  if (ticket) {
    // Its ready chunks are resident and pinned: the DRAM prefix above found
    // them. Count those it promoted, lease them, then end the ticket.
    const Promotion& p = (*ticket)->second;
    tally.request = p.request;  // the Prefetch's request
    MarkPromoted(p.dram_at_start, p.ready, p.from_remote, hits, &tally);
    for (uint32_t h : hits) dram_->Pin(h);
    ++(p.done ? counters_.prefetches.used : counters_.prefetches.used_early);
    promoter_->End(*ticket);
    GrantLookup(tally, ns, hits, resp);
    lock.unlock();
    return done(Status::Ok());
  }
  // With a ticket of its own (even one that expired) NVMe is not read: the
  // prefetch was the time for it. Another session's that is gone is no ticket.
  const bool own_ticket = req.prefetch_ticket != 0 && !req.adopt_ticket;
  const size_t run = own_ticket ? 0 : ContinuationRun(keys, hits.size(), tally.max_hits);
  // Without a lease nothing is read: NVMe chunks are checked when read, and
  // the remote tier is asked what it holds (ProbeRemote), not read.
  const size_t reach =
      req.acquire && !own_ticket ? PromotionReach(keys, hits.size(), tally.max_hits, run) : run;
  if (!req.acquire && ProbeRemote(tally, ns, keys, hits, run, resp, done)) return;
  if (!req.acquire || reach == 0) {
    // Without a lease nothing is read: NVMe chunks are checked when read.
    if (!req.acquire) tally.promoted_hits = run;
    if (req.acquire) {
      for (uint32_t h : hits) dram_->Pin(h);
    }
    GrantLookup(tally, ns, hits, resp);
    lock.unlock();
    return done(Status::Ok());
  }
  // Promote the NVMe continuation on an I/O worker; the lookup completes there.
  Promotion p;
  p.session_id = req.session_id;
  p.expiry = clock_.Now() + options_.lease_ttl;
  p.ns = ns;
  p.held_bytes = (hits.size() + reach) * ns.layout.slot_bytes;
  p.keys.assign(keys.begin(), keys.begin() + static_cast<ptrdiff_t>(hits.size() + reach));
  p.tokens.assign(all.begin(),
                  all.begin() + static_cast<ptrdiff_t>(p.keys.size() * ns.spec.chunk_tokens));
  for (uint32_t h : hits) dram_->Pin(h);
  p.ready = std::move(hits);
  p.dram_at_start = static_cast<uint32_t>(p.ready.size());
  p.on_done = [this, tally, ns, resp, done = std::move(done)](Promotion& promoted) mutable {
    Status result;
    {
      std::lock_guard relock(mu_);
      result = CheckSession(tally.session_id);
      if (result.ok()) {
        // Remote chunks are in promoted_hits too (LookupResponse.remote_chunks).
        tally.promoted_hits = promoted.ready.size() - tally.dram_hits;
        // With what an adopted ticket had read from the remote tier (MarkPromoted).
        tally.remote_at.resize(std::max(tally.remote_at.size(), promoted.from_remote.size()));
        for (size_t i = 0; i < promoted.from_remote.size(); ++i) {
          if (promoted.from_remote[i]) tally.remote_at[i] = true;
        }
        GrantLookup(tally, ns, promoted.ready, resp);  // its pins become the lease's
      } else {
        for (uint32_t h : promoted.ready) dram_->Unpin(h);
      }
    }
    done(result);
  };
  promoter_->Start(next_id_++, std::move(p));
}

void CacheCore::MarkPromoted(uint32_t dram_at_start, const std::vector<uint32_t>& ready,
                             const std::vector<bool>& from_remote,
                             const std::vector<uint32_t>& hits, LookupTally* t) {
  t->prefetched_at.assign(hits.size(), false);
  t->remote_at.assign(hits.size(), false);
  for (size_t i = dram_at_start; i < std::min(hits.size(), ready.size()); ++i) {
    if (hits[i] == ready[i]) {
      ++t->prefetched;
      t->prefetched_at[i] = true;
      t->remote_at[i] = i < from_remote.size() && from_remote[i];
    }
  }
}

Status CacheCore::Lookup(const core::LookupRequest& req, core::LookupResponse* resp) {
  std::promise<Status> finished;
  std::future<Status> result = finished.get_future();
  Lookup(req, resp, [&finished](Status st) { finished.set_value(std::move(st)); });
  return result.get();
}

void CacheCore::GrantLookup(const LookupTally& t, const NamespaceState& ns,
                            const std::vector<uint32_t>& hits, core::LookupResponse* resp) {
  // Children first, so a prefix's inner chunks stay more recent than its leaves.
  for (auto it = hits.rbegin(); it != hits.rend(); ++it) dram_->Touch(*it);
  const uint32_t ct = ns.spec.chunk_tokens;
  const uint64_t num_hits = t.acquire ? hits.size() : t.dram_hits + t.promoted_hits;
  const size_t hbm_hits = hbm_copier_ ? hbm_copier_->CountIn(hits) : 0;
  LeaseCredit credit = CountRequest(t, ns, hits);
  const auto now = std::chrono::steady_clock::now();
  lookup_latency_.Observe(now - t.started);

  resp->num_chunks = static_cast<uint32_t>(num_hits);
  resp->nvme_chunks = static_cast<uint32_t>(t.promoted_hits);
  resp->prefetched_chunks = static_cast<uint32_t>(t.prefetched);
  resp->hbm_chunks = static_cast<uint32_t>(hbm_hits);
  resp->remote_chunks =
      static_cast<uint32_t>(std::count(t.remote_at.begin(), t.remote_at.end(), true));
  if (t.hbm) hbm_copier_->Queue(hits);
  resp->cached_tokens = num_hits * ct;
  resp->lease_ttl_ms = static_cast<uint64_t>(options_.lease_ttl.count());
  if (!t.acquire || num_hits == 0) return;
  const uint64_t lease_id = next_id_++;
  Lease lease;
  lease.credit = std::move(credit);
  lease.session_id = t.session_id;
  lease.expiry = clock_.Now() + options_.lease_ttl;
  lease.granted_at = now;
  lease.handles = hits;  // pinned by the caller
  lease.held_bytes = hits.size() * ns.layout.slot_bytes;
  Hold(t.session_id, lease.held_bytes);
  resp->chunks.reserve(hits.size());
  // Bytes read: the chunks after those the engine holds (it copies only those).
  uint64_t read_chunks = 0;
  for (size_t i = 0; i < hits.size(); ++i) {
    const uint32_t h = hits[i];
    const bool read = i >= t.first_chunk;
    core::ChunkLocation& loc = resp->chunks.emplace_back();
    loc.payload_offset = dram_->Get(h).slot_offset + ns.layout.header_bytes;
    loc.payload_bytes = ns.layout.payload_bytes;
    loc.sequence = SlotSequence(dram_->SlotAddress(dram_->Get(h).slot_offset));
    read_chunks += read;
    if (!t.hbm) continue;
    if (const uint32_t hh = hbm_->Find(dram_->Get(h).key); hh != ChunkIndex::kNone) {
      hbm_->Pin(hh);
      lease.hbm_handles.push_back(hh);
      loc.hbm_payload_offset = hbm_->Get(hh).slot_offset + ns.layout.header_bytes;
      loc.hbm_sequence = hbm_copier_->SequenceOf(hh);
      if (read) {
        lease.credit.hbm_read_bytes += ns.layout.payload_bytes;
        --read_chunks;  // read from HBM
      }
    }
  }
  for (auto it = lease.hbm_handles.rbegin(); it != lease.hbm_handles.rend(); ++it) {
    hbm_->Touch(*it);
  }
  lease.credit.read_bytes = read_chunks * ns.layout.payload_bytes;
  counters_.leased.hbm_read_bytes += lease.credit.hbm_read_bytes;
  counters_.leased.read_bytes += lease.credit.read_bytes;
  leases_.Add(lease_id, std::move(lease));
  resp->lease_id = lease_id;
}

void CacheCore::EndLease(const Lease& lease, bool served) {
  if (served) ledger_.End(lease.credit.request, lease.credit.range, true);
  for (uint32_t h : lease.handles) dram_->Unpin(h);
  for (uint32_t h : lease.hbm_handles) hbm_->Unpin(h);
  Drop(lease.session_id, lease.held_bytes);
}

Status CacheCore::ReleaseRead(uint64_t session_id, uint64_t lease_id) {
  std::lock_guard lock(mu_);
  KVTIER_RETURN_IF_ERROR(CheckSession(session_id));
  auto lease = leases_.Take(lease_id, session_id);
  if (!lease.ok()) return lease.status();
  load_latency_.Observe(std::chrono::steady_clock::now() - lease->granted_at);
  EndLease(*lease);
  return Status::Ok();
}

Status CacheCore::ReleaseUnserved(uint64_t session_id, uint64_t lease_id) {
  std::lock_guard lock(mu_);
  KVTIER_RETURN_IF_ERROR(CheckSession(session_id));
  auto lease = leases_.Take(lease_id, session_id);
  if (!lease.ok()) return lease.status();
  // Its bytes were never read; its hits only as far as no other lease of the
  // request (another TP rank's) covers them.
  const LeaseCredit& c = lease->credit;
  const RequestLedger::Range back = ledger_.End(c.request, c.range, false);
  LeaseCredit taken;
  static_cast<Leased&>(taken) = c.Hits(back.from, back.to);
  taken.read_bytes = c.read_bytes;
  taken.hbm_read_bytes = c.hbm_read_bytes;
  taken.chunk_tokens = c.chunk_tokens;
  counters_.unserved += taken;
  AddTierTokens(models_[c.model].unserved_hit_tokens, taken);
  EndLease(*lease, /*served=*/false);
  return Status::Ok();
}

void CacheCore::ExpireNow() {
  const Clock::TimePoint now = clock_.Now();
  std::lock_guard lock(mu_);
  ReapOrphans();
  const std::vector<Lease> leases = leases_.TakeExpired(now);
  for (const Lease& lease : leases) EndLease(lease);
  const size_t tickets = promoter_->ExpireTickets(now);
  counters_.prefetches.expired += tickets;
  std::vector<Reservation> reservations = reservations_.TakeExpired(now);
  for (Reservation& r : reservations) {
    ReleaseReservationHolds(r);
    quarantined_[r.session_id].push_back(std::move(r));
  }
  if (leases.size() + reservations.size() + tickets > 0) {
    spdlog::info(
        "expired {} leases, {} prefetch tickets and {} reservations past their TTL or "
        "deadline (the reservations' slots return when their sessions end)",
        leases.size(), tickets, reservations.size());
  }
}

}  // namespace kvtier
