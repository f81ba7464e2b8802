// CacheCore's NVMe side: promotion into DRAM on I/O worker threads (for a
// Lookup with acquire, and for Prefetch tickets), write-through, and the
// degraded state.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "kvtier/daemon/cache_core.h"
#include "kvtier/request_id.h"
#include "request_checks.h"

namespace kvtier {
namespace {

constexpr uint64_t kDefaultPrefetchDeadlineMs = 10'000;
constexpr uint64_t kMaxPrefetchDeadlineMs = 600'000;
constexpr const char* kTicketGone = "taken over by a Lookup, expired or never granted";

}  // namespace

void CacheCore::StartWorkers() {
  for (uint32_t i = 0; i < options_.nvme_workers; ++i) {
    workers_.emplace_back([this] { WorkerLoop(); });
  }
}

void CacheCore::StopWorkers() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
  workers_.clear();
}

void CacheCore::WorkerLoop() {
  std::unique_lock lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] {
      return stopping_ || !promotion_queue_.empty() || !hbm_queue_.empty();
    });
    if (promotion_queue_.empty()) {
      if (stopping_) return;  // every promotion finished; queued HBM copies are dropped
      lock.unlock();
      HbmStep();
      lock.lock();
      continue;
    }
    const uint64_t id = promotion_queue_.front();
    promotion_queue_.pop_front();
    lock.unlock();
    PromoteStep(id);
    lock.lock();
  }
}

uint64_t CacheCore::StartPromotion(Promotion p) {
  const uint64_t id = next_id_++;
  const bool work = !p.done;
  Hold(p.session_id, p.held_bytes);
  promotions_.emplace(id, std::move(p));
  if (work) {
    promotion_queue_.push_back(id);
    work_cv_.notify_one();
  }
  return id;
}

void CacheCore::EndPromotion(std::unordered_map<uint64_t, Promotion>::iterator it) {
  for (uint32_t h : it->second.ready) dram_->Unpin(h);
  const Promotion& p = it->second;
  if (!p.on_done) prefetch_held_bytes_ -= p.keys.size() * p.ns.layout.slot_bytes;  // a ticket
  Drop(p.session_id, p.held_bytes);
  promotions_.erase(it);  // a step in flight finds it gone and keeps its chunks unpinned
}

void CacheCore::FinishPromotion(std::unique_lock<std::mutex>& lock,
                                std::unordered_map<uint64_t, Promotion>::iterator it) {
  it->second.done = true;
  if (!it->second.on_done) return;  // a ticket: held until taken over or expired
  Promotion p = std::move(it->second);
  promotions_.erase(it);
  Drop(p.session_id, p.held_bytes);  // the lease its continuation grants holds them again
  lock.unlock();
  auto on_done = std::move(p.on_done);
  on_done(p);
}

Result<std::unordered_map<uint64_t, CacheCore::Promotion>::iterator> CacheCore::FindTicket(
    uint64_t ticket, uint64_t session_id) {
  auto it = FindOwned(promotions_, ticket, session_id, "prefetch ticket",
                                      kTicketGone);
  if (it.ok() && (*it)->second.on_done) {  // a Lookup's own promotion, not a ticket
    return Status::NotFound("prefetch ticket " + std::to_string(ticket) + " is unknown (" +
                            kTicketGone + ")");
  }
  return it;
}

void CacheCore::PromoteStep(uint64_t id) {
  constexpr size_t kBatch = 8;  // reads per step: a ticket's ready count grows batch by batch
  std::unique_lock lock(mu_);
  auto it = promotions_.find(id);
  if (it == promotions_.end()) return;
  Promotion& p = it->second;
  // The live namespace (its DramTier number); gone when it was made room for.
  auto live_ns = ns_by_id_.find(p.ns.id);
  NamespaceState* ns = live_ns == ns_by_id_.end() ? nullptr : live_ns->second;
  struct Read {
    size_t index;
    uint64_t slot_offset;
  };
  std::vector<Read> plan;
  if (ns != nullptr) {
    // Chunks in DRAM already (another request promoted or stored them) join at
    // once if they pass the token check; one that fails ends the promotion
    // (the read plan below stops at a key in DRAM).
    while (p.ready.size() < p.keys.size()) {
      const size_t i = p.ready.size();
      const uint32_t h = dram_->Find(p.keys[i]);
      if (h == ChunkIndex::kNone || !TokenCheck(*ns, p.keys, p.tokens, i, h)) break;
      dram_->Pin(h);
      p.ready.push_back(h);
    }
    for (size_t i = p.ready.size(); i < p.keys.size() && plan.size() < kBatch; ++i) {
      if (dram_->Find(p.keys[i]) != ChunkIndex::kNone || !nvme_->Contains(p.keys[i])) break;
      // The ready chunks are pinned; room for the rest of this batch at once.
      auto offset = dram_->AllocateSlot(ns->ns_index, std::min(p.keys.size(), i + kBatch - plan.size()) - i);
      if (!offset) break;
      InvalidateSlot(dram_->SlotAddress(*offset));
      plan.push_back({i, *offset});
    }
  }
  if (plan.empty()) return FinishPromotion(lock, it);
  // What the reads need, copied: the promotion may end while the lock is dropped.
  const NamespaceState snap = p.ns;
  const uint32_t ct = snap.spec.chunk_tokens;
  std::vector<ChunkKey> keys, parents;
  std::vector<int32_t> tokens;
  for (const Read& r : plan) {
    keys.push_back(p.keys[r.index]);
    parents.push_back(snap.spec.ChunkParent(snap.id, p.keys, r.index));
    tokens.insert(tokens.end(), p.tokens.begin() + static_cast<ptrdiff_t>(r.index * ct),
                  p.tokens.begin() + static_cast<ptrdiff_t>((r.index + 1) * ct));
  }
  const bool is_ticket = !p.on_done;
  const uint64_t generation = evict_generation_;
  ++ns->active_reservations;  // the namespace keeps its slot class while the lock is dropped
  std::vector<NvmeTier::ReadRequest> reads;
  for (size_t k = 0; k < plan.size(); ++k) {
    reads.push_back({{snap.id, keys[k], parents[k],
                      std::span<const int32_t>(tokens).subspan(k * ct, ct)},
                     &snap.layout,
                     {dram_->SlotAddress(plan[k].slot_offset), snap.layout.slot_bytes},
                     Status::Ok()});
  }
  lock.unlock();
  const Status io = nvme_->ReadMany(reads);
  lock.lock();
  --ns->active_reservations;
  NoteNvmeIo(io.ok());
  it = promotions_.find(id);
  Promotion* live = it == promotions_.end() ? nullptr : &it->second;
  // An admin eviction meanwhile may have removed what was read: keep none of it.
  bool stopped = generation != evict_generation_;
  size_t promoted = 0;
  for (size_t k = 0; k < plan.size(); ++k) {
    uint32_t h = ChunkIndex::kNone;
    if (!stopped && io.ok() && reads[k].result.ok()) {
      h = dram_->Insert(keys[k], parents[k], snap.id, ns->ns_index, plan[k].slot_offset);
      if (h != ChunkIndex::kNone) {
        ++promoted;
      } else if ((h = dram_->Find(keys[k])) != ChunkIndex::kNone) {
        dram_->FreeSlot(ns->ns_index, plan[k].slot_offset);  // promoted by another meanwhile
      }
    }
    if (h == ChunkIndex::kNone) {
      dram_->FreeSlot(ns->ns_index, plan[k].slot_offset);
      stopped = true;  // a failed read, or its parent left DRAM (the ticket ended)
      continue;
    }
    if (live != nullptr && live->ready.size() == plan[k].index) {
      dram_->Pin(h);
      live->ready.push_back(h);
    }
  }
  counters_.nvme_read_bytes += promoted * snap.layout.payload_bytes;
  if (is_ticket) counters_.prefetched_chunks += promoted;
  if (live == nullptr) return;
  if (live->to_hbm) QueueHbmCopies(live->ready);
  if (stopped || live->ready.size() == live->keys.size()) return FinishPromotion(lock, it);
  promotion_queue_.push_back(id);
  work_cv_.notify_one();
}

Status CacheCore::Prefetch(const core::PrefetchRequest& req, core::PrefetchResponse* resp) {
  auto prompt = request_checks::PromptTokens(req.tokens, options_.max_prompt_tokens);
  if (!prompt.ok()) return prompt.status();
  KVTIER_RETURN_IF_ERROR(CheckRequestId(req.request_id));
  if (req.deadline_ms > kMaxPrefetchDeadlineMs) {
    return Status::InvalidArgument("deadline_ms " + std::to_string(req.deadline_ms) +
                                   " is more than 600000 (10 min)");
  }
  const uint64_t deadline_ms = req.deadline_ms == 0 ? kDefaultPrefetchDeadlineMs : req.deadline_ms;
  auto resolved = ResolveRequest(req.session_id, req.epoch, req.namespace_id);
  if (!resolved.ok()) return resolved.status();
  const NamespaceState& ns = *resolved;
  const std::span<const int32_t> all = *prompt;
  const std::vector<ChunkKey> keys = ns.spec.ChunkKeys(ns.id, all);
  const size_t limit =
      req.max_chunks == 0 ? keys.size() : std::min<size_t>(keys.size(), req.max_chunks);

  if (req.to_hbm && !hbm_) {
    return Status::FailedPrecondition("to_hbm: the HBM tier is off (start kvtierd with "
                                      "--hbm-bytes)");
  }
  std::unique_lock lock(mu_);
  KVTIER_RETURN_IF_ERROR(CheckSession(req.session_id));
  // A ticket holds at most what is left of the prefetch budget.
  const uint64_t budget = dram_->capacity_bytes() / 2 - prefetch_held_bytes_;
  size_t affordable = std::min<uint64_t>(limit, budget / ns.layout.slot_bytes);
  if (const size_t allowed = SessionAllowance(req.session_id, ns.layout.slot_bytes);
      allowed < affordable) {
    affordable = allowed;
    ++counters_.session_limited;
  }
  std::vector<uint32_t> hits = DramPrefix(ns, keys, all, affordable);
  const size_t run = ContinuationRun(keys, hits.size(), affordable);
  resp->deadline_ms = deadline_ms;
  resp->ready_chunks = static_cast<uint32_t>(hits.size());
  resp->total_chunks = static_cast<uint32_t>(hits.size() + run);
  resp->nvme_chunks = static_cast<uint32_t>(run);
  std::string request = RequestLedger::Named(req.request_id);
  if (hits.size() + run == 0) {
    CountPrompt(request, all.size(), keys.size());
    return Status::Ok();
  }
  Promotion p;
  p.session_id = req.session_id;
  p.expiry = clock_.Now() + std::chrono::milliseconds(deadline_ms);
  p.ns = ns;
  p.held_bytes = (hits.size() + run) * ns.layout.slot_bytes;
  p.keys.assign(keys.begin(), keys.begin() + static_cast<ptrdiff_t>(hits.size() + run));
  p.tokens.assign(all.begin(), all.begin() + static_cast<ptrdiff_t>(p.keys.size() *
                                                                    ns.spec.chunk_tokens));
  for (uint32_t h : hits) {
    dram_->Touch(h);
    dram_->Pin(h);
  }
  p.ready = std::move(hits);
  p.dram_at_start = static_cast<uint32_t>(p.ready.size());
  p.done = run == 0;
  p.to_hbm = req.to_hbm;
  if (p.to_hbm) QueueHbmCopies(p.ready);
  prefetch_held_bytes_ += p.keys.size() * ns.layout.slot_bytes;
  const uint64_t ticket = StartPromotion(std::move(p));
  if (request.empty()) request = RequestLedger::Ticket(ticket);
  CountPrompt(request, all.size(), keys.size());
  promotions_.at(ticket).request = std::move(request);
  resp->ticket = ticket;
  return Status::Ok();
}

Status CacheCore::PrefetchStatus(uint64_t session_id, uint64_t ticket,
                                 core::PrefetchStatusResponse* resp) {
  std::lock_guard lock(mu_);
  KVTIER_RETURN_IF_ERROR(CheckSession(session_id));
  auto it = FindTicket(ticket, session_id);
  if (!it.ok()) return it.status();
  const Promotion& p = (*it)->second;
  resp->ready_chunks = static_cast<uint32_t>(p.ready.size());
  resp->total_chunks = static_cast<uint32_t>(p.keys.size());
  resp->done = p.done;
  size_t in_hbm = 0;
  while (hbm_ && in_hbm < p.ready.size() &&
         hbm_->Find(dram_->Get(p.ready[in_hbm]).key) != ChunkIndex::kNone) {
    ++in_hbm;
  }
  resp->hbm_chunks = static_cast<uint32_t>(in_hbm);
  bool hbm_pending = false;
  for (size_t i = in_hbm; hbm_ && p.to_hbm && !hbm_pending && i < p.ready.size(); ++i) {
    hbm_pending = hbm_queued_.count(dram_->Get(p.ready[i]).key) > 0;
  }
  resp->hbm_done = p.to_hbm && p.done && !hbm_pending;
  return Status::Ok();
}

void CacheCore::QueueNvmeWrite(uint32_t handle) {
  const ChunkEntry& e = dram_->Get(handle);
  dram_->HoldForWrite(handle);  // evicted before its write only when nothing else can be
  const uint64_t slot_bytes = namespaces_[e.ns_index]->layout.slot_bytes;
  nvme_queue_.push_back({e.key, SlotSequence(dram_->SlotAddress(e.slot_offset)), slot_bytes});
  nvme_queue_bytes_ += slot_bytes;
}

bool CacheCore::WaitForWriteThrough(std::unique_lock<std::mutex>& lock, uint64_t incoming) {
  // The queue and this store together stay within half the arena; a store
  // larger than that alone waits for an empty queue.
  const uint64_t bound = options_.dram_bytes / 2;
  const auto room = [&] {
    return nvme_queue_bytes_ == 0 || nvme_queue_bytes_ + incoming <= bound;
  };
  if (room()) return true;
  // Real time, not clock_: the writer runs in real time whatever the test clock says.
  nvme_progress_cv_.wait_for(lock, options_.write_through_wait,
                             [&] { return room() || stopping_; });
  return room();
}

void CacheCore::Demote(uint32_t handle, bool count_skips) {
  // The victim and its ancestors not on NVMe yet: leaf-first eviction takes
  // children first, and NVMe refuses a chunk whose parent it does not hold.
  std::vector<uint32_t> chain;
  for (uint32_t h = handle; h != ChunkIndex::kNone;) {
    const ChunkEntry& e = dram_->Get(h);
    if (nvme_->Contains(e.key) || demoting_.count(e.key) > 0) break;
    chain.push_back(h);
    h = dram_->Find(e.parent);  // kNone past the first chunk (its parent is the namespace)
  }
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {  // parents first
    const ChunkEntry& e = dram_->Get(*it);
    const NamespaceState& ns = *namespaces_[e.ns_index];
    if (demotion_bytes_ + ns.layout.slot_bytes > options_.write_back_buffer_bytes) {
      // The victim is lost to NVMe; its ancestors stay in DRAM for a later try.
      if (count_skips) ++counters_.nvme_skipped_writes;
      return;
    }
    Demotion d{e.key, e.parent, ns.id, ns.layout,
               {static_cast<std::byte*>(std::aligned_alloc(kBlockBytes, ns.layout.slot_bytes)),
                &std::free}};
    std::memcpy(d.image.get(), dram_->SlotAddress(e.slot_offset), ns.layout.slot_bytes);
    demotion_bytes_ += ns.layout.slot_bytes;
    demoting_.insert(e.key);
    demotions_.push_back(std::move(d));
  }
}

void CacheCore::PersistNvmeAccessTimes() {
  if (!nvme_ || !nvme_->write_failure().empty()) return;
  if (Status st = nvme_->PersistAccessTimes(); !st.ok()) {
    if (auto held_back = access_times_log_.Admit()) {
      spdlog::warn("NVMe tier: persisting access times failed: {}{}", st.ToString(),
                   HeldBack(*held_back));
    }
  }
}

size_t CacheCore::PendingNvmeWrites() const {
  std::lock_guard lock(mu_);
  return nvme_queue_.size() + demotions_.size() + nvme_in_flight_;
}

size_t CacheCore::WriteBackDramOnly() const {
  if (!nvme_ || options_.nvme_write_policy != NvmeWritePolicy::kWriteBack) return 0;
  std::lock_guard lock(mu_);
  size_t n = 0;  // those queued for the writer are PendingNvmeWrites', not counted twice
  dram_->ForEachChunk([&](uint32_t h) {
    const ChunkKey& key = dram_->Get(h).key;
    n += !nvme_->Contains(key) && demoting_.count(key) == 0;
  });
  return n;
}

size_t CacheCore::FlushWriteBack(const std::function<bool()>& keep_going) {
  if (!nvme_ || options_.nvme_write_policy != NvmeWritePolicy::kWriteBack) return 0;
  std::vector<ChunkKey> keys;
  {
    std::lock_guard lock(mu_);
    dram_->ForEachChunk([&](uint32_t h) {
      if (!nvme_->Contains(dram_->Get(h).key)) keys.push_back(dram_->Get(h).key);
    });
  }
  size_t next = 0, queued = 0;
  while (next < keys.size() && DegradedTiers().empty() && keep_going()) {
    {
      std::lock_guard lock(mu_);
      while (next < keys.size() && demotion_bytes_ < options_.write_back_buffer_bytes &&
             (next % 64 != 0 || keep_going())) {  // copying 256 MiB takes a while: check often
        const uint32_t h = dram_->Find(keys[next++]);
        if (h == ChunkIndex::kNone) continue;
        Demote(h, /*count_skips=*/false);
        if (demoting_.count(dram_->Get(h).key) == 0 && !nvme_->Contains(dram_->Get(h).key)) {
          if (demotion_bytes_ == 0) continue;  // larger than the whole buffer: left out
          --next;  // the buffer filled on its ancestors: again after the writes
          break;
        }
        ++queued;
      }
    }
    while (keep_going() && WriteThroughOnce() > 0) {
    }
  }
  return queued;
}

size_t CacheCore::WriteThroughOnce() {
  if (!nvme_) return 0;
  constexpr size_t kBatch = kWriteThroughBatchChunks;
  // The batch's copies stay in staging_.
  const uint64_t max_batch_bytes =
      std::min<uint64_t>(kWriteThroughBatchBytes, dram_->capacity_bytes() / 16);
  std::vector<Demotion> demoted;
  {
    std::lock_guard lock(mu_);
    if (admin_evictions_running_ > 0) return 0;  // it waits for the writes in flight
    while (!demotions_.empty() && demoted.size() < kBatch) {
      demoted.push_back(std::move(demotions_.front()));
      demotions_.pop_front();
    }
    nvme_in_flight_ += demoted.size();
  }
  if (!demoted.empty()) {  // write-back: the images were copied out at eviction
    std::vector<NvmeImage> images;
    for (Demotion& d : demoted) {
      SealPayloadChecksum(d.image.get(), d.layout);
      images.push_back({d.key, d.parent, d.ns, {d.image.get(), d.layout.slot_bytes}});
    }
    Result<size_t> stored = nvme_->Write(images);
    std::lock_guard lock(mu_);
    NoteNvmeWrite(stored.status(), "write-back", images.size());
    EndNvmeWrites(demoted.size());
    for (const Demotion& d : demoted) {
      demoting_.erase(d.key);
      demotion_bytes_ -= d.layout.slot_bytes;
      // Counted by where each chunk is now, not by how many Write stored: it
      // skips some (parent gone, no room) and a failed batch stores none.
      if (nvme_->Contains(d.key)) {
        counters_.nvme_write_bytes += d.layout.payload_bytes;
      } else {
        ++counters_.nvme_lost_writes;
      }
    }
    return demoted.size();
  }
  struct Item {
    uint32_t handle;
    ChunkKey key, parent;
    NamespaceId ns;
    SlotLayout layout;
    const std::byte* slot;
  };
  std::vector<Item> items;
  size_t taken = 0;
  {
    std::lock_guard lock(mu_);
    if (admin_evictions_running_ > 0) return 0;
    uint64_t batch_bytes = 0;  // the copies below: max_batch_bytes and one slot at most
    while (!nvme_queue_.empty() && taken < kBatch && batch_bytes < max_batch_bytes) {
      const PendingWrite w = nvme_queue_.front();
      const ChunkKey& key = w.key;
      nvme_queue_.pop_front();
      nvme_queue_bytes_ -= w.slot_bytes;
      ++taken;
      const uint32_t h = dram_->Find(key);
      if (h == ChunkIndex::kNone ||
          SlotSequence(dram_->SlotAddress(dram_->Get(h).slot_offset)) != w.sequence) {
        ++counters_.nvme_skipped_writes;  // evicted before its turn: NVMe lagged
        continue;
      }
      dram_->ReleaseWriteHold(h);
      dram_->Pin(h);  // while it is copied
      if (nvme_->Contains(key)) {
        dram_->Unpin(h);
        continue;
      }
      const ChunkEntry& e = dram_->Get(h);
      const NamespaceState& ns = *namespaces_[e.ns_index];
      items.push_back({h, key, e.parent, ns.id, ns.layout, dram_->SlotAddress(e.slot_offset)});
      batch_bytes += ns.layout.slot_bytes;
    }
    nvme_in_flight_ += items.size();
  }
  if (taken == 0) return 0;
  std::lock_guard staging_lock(staging_mu_);  // before mu_, never inside it
  uint64_t staging_bytes = 0;
  for (const Item& it : items) staging_bytes += it.layout.slot_bytes;
  std::byte* copy = staging_.Reserve(staging_bytes);
  std::vector<NvmeImage> images;
  for (const Item& it : items) {
    std::memcpy(copy, it.slot, it.layout.slot_bytes);
    SealPayloadChecksum(copy, it.layout);
    images.push_back({it.key, it.parent, it.ns, {copy, it.layout.slot_bytes}});
    copy += it.layout.slot_bytes;  // slot sizes are multiples of 4096: each copy stays aligned
  }
  {  // Copied: DRAM may evict them now; the copies go to NVMe.
    std::lock_guard lock(mu_);
    for (const Item& it : items) dram_->Unpin(it.handle);
  }
  nvme_progress_cv_.notify_all();  // ReserveWrites waiting for room under the bound
  Result<size_t> stored = images.empty() ? Result<size_t>(size_t{0}) : nvme_->Write(images);
  std::lock_guard lock(mu_);
  if (!images.empty()) NoteNvmeWrite(stored.status(), "write-through", images.size());
  EndNvmeWrites(items.size());
  for (const Item& it : items) {  // as for write-back: by where each chunk is now
    if (nvme_->Contains(it.key)) {
      counters_.nvme_write_bytes += it.layout.payload_bytes;
    } else {
      ++counters_.nvme_lost_writes;
    }
  }
  return taken;
}

void CacheCore::EndNvmeWrites(size_t n) {
  nvme_in_flight_ -= n;
  if (nvme_in_flight_ == 0) nvme_idle_cv_.notify_all();
}

void CacheCore::NoteNvmeIo(bool ok) {
  const bool was_degraded = NvmeDegraded();
  if (ok) {
    counters_.nvme_failure_streak = 0;
  } else {
    ++counters_.nvme_io_errors;
    ++counters_.nvme_failure_streak;
  }
  if (was_degraded == NvmeDegraded()) return;
  if (was_degraded) {
    spdlog::info("NVMe tier: I/O succeeds again; no longer degraded");
  } else if (const std::string why = nvme_->write_failure(); !why.empty()) {
    spdlog::error("NVMe tier degraded until kvtierd restarts: its index takes no more writes "
                  "({}); DRAM keeps serving, NVMe chunks are still read", why);
  } else {
    spdlog::error("NVMe tier degraded: {} I/O batches failed in a row; DRAM keeps serving",
                  kNvmeDegradedAfter);
  }
}

void CacheCore::NoteNvmeWrite(const Status& status, const char* what, size_t chunks) {
  NoteNvmeIo(status.ok());
  if (status.ok() == !nvme_writes_failing_) return;
  nvme_writes_failing_ = !status.ok();
  if (nvme_writes_failing_) {  // once per run of failures: io_errors counts each batch
    spdlog::warn("NVMe {} of {} chunks failed: {}; later failures are counted in io_errors{}",
                 what, chunks, status.ToString(),
                 nvme_->write_failure().empty() ? "" : "; the tier is degraded until kvtierd restarts");
  } else {
    spdlog::info("NVMe writes succeed again");
  }
}

bool CacheCore::NvmeDegraded() const {
  return nvme_ && (counters_.nvme_failure_streak >= kNvmeDegradedAfter ||
                   !nvme_->write_failure().empty());
}

std::vector<std::string> CacheCore::DegradedTiers() const {
  std::lock_guard lock(mu_);
  if (NvmeDegraded()) return {"nvme"};
  return {};
}

}  // namespace kvtier
