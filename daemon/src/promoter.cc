#include "kvtier/daemon/promoter.h"

#include <algorithm>

#include "kvtier/daemon/owned_table.h"

namespace kvtier {
namespace {

constexpr const char* kTicketGone = "taken over by a Lookup, expired or never granted";

}  // namespace

Promoter::Promoter(std::mutex& mu, DramTier& dram, NvmeTier* nvme, NvmeHealth* health,
                   HbmCopier* hbm, RemoteTier* remote, std::condition_variable& work_cv,
                   Hooks hooks)
    : mu_(mu),
      dram_(dram),
      nvme_(nvme),
      health_(health),
      hbm_(hbm),
      remote_(remote),
      work_cv_(work_cv),
      hooks_(std::move(hooks)) {}

void Promoter::Start(uint64_t id, Promotion p) {
  p.started = std::chrono::steady_clock::now();
  const bool work = !p.done;
  hooks_.hold(p.session_id, p.held_bytes);
  if (p.is_ticket()) ticket_bytes_ += p.keys.size() * p.ns.layout.slot_bytes;
  promotions_.emplace(id, std::move(p));
  if (work) {
    queue_.push_back(id);
    work_cv_.notify_one();
  }
}

std::optional<uint64_t> Promoter::NextWork() {
  if (queue_.empty()) return std::nullopt;
  const uint64_t id = queue_.front();
  queue_.pop_front();
  return id;
}

template <typename Pred>
size_t Promoter::EndTicketsIf(Pred pred) {
  size_t ended = 0;
  for (auto it = promotions_.begin(); it != promotions_.end();) {
    auto next = std::next(it);
    if (it->second.is_ticket() && pred(it->second)) {
      End(it);
      ++ended;
    }
    it = next;
  }
  return ended;
}

size_t Promoter::EndSession(uint64_t session_id) {
  return EndTicketsIf([&](const Promotion& p) { return p.session_id == session_id; });
}

size_t Promoter::ExpireTickets(Clock::TimePoint now) {
  return EndTicketsIf([&](const Promotion& p) { return p.expiry <= now; });
}

size_t Promoter::ActiveTickets() const {
  return static_cast<size_t>(
      std::count_if(promotions_.begin(), promotions_.end(),
                    [](const auto& entry) { return entry.second.is_ticket(); }));
}

void Promoter::End(Table::iterator it) {
  for (uint32_t h : it->second.ready) dram_.Unpin(h);
  const Promotion& p = it->second;
  if (p.is_ticket()) ticket_bytes_ -= p.keys.size() * p.ns.layout.slot_bytes;
  hooks_.drop(p.session_id, p.held_bytes);
  promotions_.erase(it);  // a step in flight finds it gone and keeps its chunks unpinned
}

void Promoter::Finish(std::unique_lock<std::mutex>& lock, Table::iterator it) {
  it->second.done = true;
  promotion_latency_.Observe(std::chrono::steady_clock::now() - it->second.started);
  if (it->second.is_ticket()) {  // held until taken over or expired: what became ready
    Promotion& t = it->second;
    const uint64_t unused = (t.keys.size() - t.ready.size()) * t.ns.layout.slot_bytes;
    ticket_bytes_ -= unused;
    t.held_bytes -= std::min(t.held_bytes, unused);
    hooks_.drop(t.session_id, unused);
    t.keys.resize(t.ready.size());
    t.tokens.resize(t.keys.size() * t.ns.spec.chunk_tokens);
    return;
  }
  Promotion p = std::move(it->second);
  promotions_.erase(it);
  hooks_.drop(p.session_id, p.held_bytes);  // the lease its continuation grants holds them again
  lock.unlock();
  auto on_done = std::move(p.on_done);
  on_done(p);
}

Result<Promoter::Table::iterator> Promoter::FindTicket(uint64_t ticket, uint64_t session_id) {
  auto it = FindOwned(promotions_, ticket, session_id, "prefetch ticket", kTicketGone);
  if (it.ok() && !(*it)->second.is_ticket()) {  // a Lookup's own promotion, not a ticket
    return Status::NotFound("prefetch ticket " + std::to_string(ticket) + " is unknown (" +
                            kTicketGone + ")");
  }
  return it;
}

Result<Promoter::Table::iterator> Promoter::FindRequestTicket(uint64_t ticket,
                                                              const std::string& request,
                                                              const NamespaceId& ns) {
  auto it = promotions_.find(ticket);
  if (it == promotions_.end() || !it->second.is_ticket()) {
    return Status::NotFound("prefetch ticket " + std::to_string(ticket) + " is unknown (" +
                            kTicketGone + ")");
  }
  if (it->second.request != request || it->second.ns.id != ns) {
    return Status::InvalidArgument("prefetch ticket " + std::to_string(ticket) +
                                   " was granted for another request or namespace (adopt_ticket "
                                   "takes over a Prefetch of the same request_id only)");
  }
  return it;
}

bool Promoter::JoinResident(Promotion& p, const CoreNamespace& ns) {
  // Chunks in DRAM already (another request promoted or stored them) join at
  // once if they pass the token check; one that fails ends the promotion
  // (false: the read plan must not go past it).
  while (p.ready.size() < p.keys.size()) {
    const size_t i = p.ready.size();
    const uint32_t h = dram_.Find(p.keys[i]);
    if (h == ChunkIndex::kNone) return true;
    if (!hooks_.token_check(ns, p.keys, p.tokens, i, h)) return false;
    dram_.Pin(h);
    p.ready.push_back(h);
  }
  return true;
}

Status Promoter::ReadRemote(std::span<NvmeTier::ReadRequest> reads) {
  std::vector<RemoteTier::ReadRequest> remote;
  remote.reserve(reads.size());
  for (const NvmeTier::ReadRequest& r : reads) remote.push_back({r.id, r.layout, r.buffer, {}});
  {
    LatencyTimer timer(remote_read_latency_);
    remote_->ReadMany(remote);
  }
  for (size_t k = 0; k < reads.size(); ++k) reads[k].result = remote[k].result;
  return Status::Ok();  // each miss ends the promotion where it is
}

void Promoter::Step(uint64_t id) {
  constexpr size_t kBatch = 8;  // reads per step: a ticket's ready count grows batch by batch
  std::unique_lock lock(mu_);
  auto it = promotions_.find(id);
  if (it == promotions_.end()) return;
  Promotion& p = it->second;
  // The live namespace (its DramTier number); gone when it was made room for.
  CoreNamespace* ns = hooks_.live_namespace(p.ns.id);
  struct Read {
    size_t index;
    uint64_t slot_offset;
  };
  std::vector<Read> plan;
  bool from_remote = false;
  if (ns != nullptr && (nvme_ != nullptr || remote_ != nullptr) && JoinResident(p, *ns) &&
      p.ready.size() < p.keys.size()) {
    // This batch's tier: NVMe while the next chunk is there, else the remote tier.
    const size_t first = p.ready.size();
    from_remote = nvme_ == nullptr || !nvme_->Contains(p.keys[first]);
    for (size_t i = first; i < p.keys.size() && plan.size() < kBatch; ++i) {
      if (from_remote && remote_ == nullptr) break;
      if (dram_.Find(p.keys[i]) != ChunkIndex::kNone) break;
      const bool on_nvme = nvme_ != nullptr && nvme_->Contains(p.keys[i]);
      if (on_nvme == from_remote) break;  // one tier per batch
      // The ready chunks are pinned; room for the rest of this batch at once.
      const size_t room = std::min(p.keys.size(), i + kBatch - plan.size()) - i;
      auto offset = dram_.AllocateSlot(ns->ns_index, room);
      if (!offset) break;
      InvalidateSlot(dram_.SlotAddress(*offset));
      plan.push_back({i, *offset});
    }
  }
  if (plan.empty()) return Finish(lock, it);
  // What the reads need, copied: the promotion may end while the lock is dropped.
  const CoreNamespace snap = p.ns;
  const uint32_t ct = snap.spec.chunk_tokens;
  std::vector<ChunkKey> keys, parents;
  std::vector<int32_t> tokens;
  for (const Read& r : plan) {
    keys.push_back(p.keys[r.index]);
    parents.push_back(snap.spec.ChunkParent(snap.id, p.keys, r.index));
    tokens.insert(tokens.end(), p.tokens.begin() + static_cast<ptrdiff_t>(r.index * ct),
                  p.tokens.begin() + static_cast<ptrdiff_t>((r.index + 1) * ct));
  }
  const bool is_ticket = p.is_ticket();
  const uint64_t generation = evict_generation_;
  ++ns->active_reservations;  // the namespace keeps its slot class while the lock is dropped
  std::vector<NvmeTier::ReadRequest> reads;
  for (size_t k = 0; k < plan.size(); ++k) {
    reads.push_back(
        {{snap.id, keys[k], parents[k], std::span<const int32_t>(tokens).subspan(k * ct, ct)},
         &snap.layout,
         {dram_.SlotAddress(plan[k].slot_offset), snap.layout.slot_bytes},
         Status::Ok()});
  }
  // Every promoted image gets a sequence of its own, wherever it was read from: one that kept
  // the sequence it was stored with would show a slot that held it, then another chunk, then
  // it again, as unchanged to a reader whose lease lapsed meanwhile.
  const uint64_t first_sequence = hooks_.take_sequences(plan.size());
  lock.unlock();
  const Status io = from_remote ? ReadRemote(reads) : [&] {
    LatencyTimer timer(nvme_read_latency_);
    return nvme_->ReadMany(reads);
  }();
  for (size_t k = 0; k < reads.size(); ++k) {
    if (io.ok() && reads[k].result.ok()) {
      RestampSlotSequence(reads[k].buffer.data(), *reads[k].layout, first_sequence + k);
    }
  }
  lock.lock();
  --ns->active_reservations;
  if (!from_remote) health_->NoteIo(io.ok());
  it = promotions_.find(id);
  Promotion* live = it == promotions_.end() ? nullptr : &it->second;
  // An admin eviction meanwhile may have removed what was read: keep none of it.
  bool stopped = generation != evict_generation_;
  size_t promoted = 0;
  for (size_t k = 0; k < plan.size(); ++k) {
    uint32_t h = ChunkIndex::kNone;
    if (!stopped && io.ok() && reads[k].result.ok()) {
      h = dram_.Insert(keys[k], parents[k], snap.id, ns->ns_index, plan[k].slot_offset);
      if (h != ChunkIndex::kNone) {
        ++promoted;
        if (from_remote) hooks_.remote_promoted(h);
      } else if ((h = dram_.Find(keys[k])) != ChunkIndex::kNone) {
        dram_.FreeSlot(ns->ns_index, plan[k].slot_offset);  // promoted by another meanwhile
      }
    }
    if (h == ChunkIndex::kNone) {
      dram_.FreeSlot(ns->ns_index, plan[k].slot_offset);
      stopped = true;  // a failed read, or its parent left DRAM (the ticket ended)
      continue;
    }
    if (live != nullptr && live->ready.size() == plan[k].index) {
      dram_.Pin(h);
      if (from_remote) {
        live->from_remote.resize(live->ready.size() + 1);
        live->from_remote.back() = true;
      }
      live->ready.push_back(h);
    }
  }
  (from_remote ? counters_.remote_read_bytes : counters_.read_bytes) +=
      promoted * snap.layout.payload_bytes;
  if (is_ticket) counters_.prefetched_chunks += promoted;
  if (live == nullptr) return;
  if (live->to_hbm) hbm_->Queue(live->ready);
  if (stopped || live->ready.size() == live->keys.size()) return Finish(lock, it);
  queue_.push_back(id);
  work_cv_.notify_one();
}

}  // namespace kvtier
