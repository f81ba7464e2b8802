// CacheCore's Prefetch and PrefetchStatus (over the Promoter), its I/O
// workers (promotion steps and HBM copies), and its NVMe writer's entry points.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "kvtier/daemon/cache_core.h"
#include "kvtier/request_id.h"
#include "request_checks.h"

namespace kvtier {
namespace {

constexpr uint64_t kDefaultPrefetchDeadlineMs = 10'000;
constexpr uint64_t kMaxPrefetchDeadlineMs = 600'000;

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
    if (destager_) destager_->Stop();
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
  workers_.clear();
}

void CacheCore::WorkerLoop() {
  std::unique_lock lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] {
      return stopping_ || promoter_->HasWork() || !remote_probes_.empty() ||
             (hbm_copier_ && hbm_copier_->Pending() > 0);
    });
    if (const std::optional<uint64_t> id = promoter_->NextWork()) {
      lock.unlock();
      promoter_->Step(*id);
      lock.lock();
      continue;
    }
    if (!remote_probes_.empty()) {  // answered even when stopping: a Lookup waits on each
      std::function<void()> probe = std::move(remote_probes_.front());
      remote_probes_.pop_front();
      lock.unlock();
      probe();
      lock.lock();
      continue;
    }
    if (stopping_) return;  // every promotion finished; queued HBM copies are dropped
    lock.unlock();
    hbm_copier_->Step();
    lock.lock();
  }
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
    return Status::FailedPrecondition(
        "to_hbm: the HBM tier is off (start kvtierd with "
        "--hbm-bytes)");
  }
  // The remote tier, asked without mu_ held: which chunks past what DRAM and
  // NVMe hold it has, so that the ticket promises only those.
  size_t probe_from = 0, remote_present = 0;
  if (remote_ && !remote_->Degraded()) {
    {
      std::lock_guard lock(mu_);
      probe_from = LocalRun(keys, limit);
    }
    remote_present = remote_->PresentRun(
        ns.id, std::span<const ChunkKey>(keys).subspan(probe_from, limit - probe_from));
  }
  std::unique_lock lock(mu_);
  KVTIER_RETURN_IF_ERROR(CheckSession(req.session_id));
  // A ticket holds at most what is left of the prefetch budget.
  const uint64_t budget = dram_->capacity_bytes() / 2 - promoter_->ticket_bytes();
  size_t affordable = std::min<uint64_t>(limit, budget / ns.layout.slot_bytes);
  if (const size_t allowed = SessionAllowance(req.session_id, ns.layout.slot_bytes);
      allowed < affordable) {
    affordable = allowed;
    ++counters_.session_limited;
  }
  std::vector<uint32_t> hits = DramPrefix(ns, keys, all, affordable);
  const size_t run = ContinuationRun(keys, hits.size(), affordable);
  // The remote run counts when DRAM and NVMe still end where they did at the
  // probe (else none: the ticket promises nothing it has not seen).
  const size_t reach =
      run + (hits.size() + run == probe_from
                 ? std::min(remote_present, affordable - std::min(affordable, probe_from))
                 : 0);
  resp->deadline_ms = deadline_ms;
  resp->ready_chunks = static_cast<uint32_t>(hits.size());
  resp->total_chunks = static_cast<uint32_t>(hits.size() + reach);
  resp->nvme_chunks = static_cast<uint32_t>(run);
  resp->remote_chunks = static_cast<uint32_t>(reach - run);
  std::string request = RequestLedger::Named(req.request_id);
  if (hits.size() + reach == 0) {
    ++(affordable == 0 && limit > 0 ? counters_.prefetches.over_budget
                                    : counters_.prefetches.nothing_cached);
    CountPrompt(request, ns, all.size(), keys.size());
    return Status::Ok();
  }
  Promotion p;
  p.session_id = req.session_id;
  p.expiry = clock_.Now() + std::chrono::milliseconds(deadline_ms);
  p.ns = ns;
  p.held_bytes = (hits.size() + reach) * ns.layout.slot_bytes;
  p.keys.assign(keys.begin(), keys.begin() + static_cast<ptrdiff_t>(hits.size() + reach));
  p.tokens.assign(all.begin(),
                  all.begin() + static_cast<ptrdiff_t>(p.keys.size() * ns.spec.chunk_tokens));
  for (uint32_t h : hits) {
    dram_->Touch(h);
    dram_->Pin(h);
  }
  p.ready = std::move(hits);
  p.dram_at_start = static_cast<uint32_t>(p.ready.size());
  p.done = reach == 0;
  p.to_hbm = req.to_hbm;
  if (p.to_hbm) hbm_copier_->Queue(p.ready);
  const uint64_t ticket = next_id_++;
  if (request.empty()) request = RequestLedger::Ticket(ticket);
  CountPrompt(request, ns, all.size(), keys.size());
  p.request = std::move(request);
  promoter_->Start(ticket, std::move(p));
  resp->ticket = ticket;
  return Status::Ok();
}

Status CacheCore::PrefetchStatus(uint64_t session_id, uint64_t ticket,
                                 core::PrefetchStatusResponse* resp) {
  std::lock_guard lock(mu_);
  KVTIER_RETURN_IF_ERROR(CheckSession(session_id));
  auto it = promoter_->FindTicket(ticket, session_id);
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
    hbm_pending = hbm_copier_->Queued(dram_->Get(p.ready[i]).key);
  }
  resp->hbm_done = p.to_hbm && p.done && !hbm_pending;
  return Status::Ok();
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
  return destager_ ? destager_->Pending() : 0;
}

size_t CacheCore::WriteBackDramOnly() const { return destager_ ? destager_->DramOnly() : 0; }

size_t CacheCore::FlushWriteBack(const std::function<bool()>& keep_going) {
  return destager_ ? destager_->FlushWriteBack(keep_going) : 0;
}

size_t CacheCore::DestageOnce() { return destager_ ? destager_->WriteOnce() : 0; }

size_t CacheCore::DestageBatches(size_t max_batches, const std::function<bool()>& keep_going) {
  return destager_ ? destager_->WriteBatches(max_batches, keep_going) : 0;
}

std::vector<std::string> CacheCore::DegradedTiers() const {
  std::vector<std::string> degraded;
  {
    std::lock_guard lock(mu_);
    if (NvmeDegraded()) degraded.push_back("nvme");
  }
  if (remote_ && remote_->Degraded()) degraded.push_back("remote");
  return degraded;
}

}  // namespace kvtier
