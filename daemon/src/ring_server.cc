#include "ring_server.h"

#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <system_error>

#include "kvtier/daemon/core_wire.h"
#include "kvtier/fd_passing.h"
#include "kvtier/logging.h"

namespace kvtier {

namespace {

using SteadyTime = std::chrono::steady_clock;

// How long a ring's thread spins after its last call before it sleeps, and
// how often a sleeping one looks whether its session or kvtierd ended.
constexpr auto kSpin = std::chrono::microseconds(50);
constexpr auto kIdleCheck = std::chrono::milliseconds(100);
constexpr int kHelloTimeoutMs = 200;
constexpr size_t kMaxWaiting = 64;  // connections that have not sent their hello yet
// Rings (64 MiB of address space each) open at once; a session past it is
// refused one and uses gRPC.
constexpr size_t kMaxRings = 1024;
// Threads serving rings: half the cores (the other half for the clients
// spinning on their answers, and kvtierd's other work), more only when each
// serves as many rings as one futex_waitv sleeps on.
const size_t kPollers = std::max(1u, std::thread::hardware_concurrency() / 2);
constexpr size_t kRingsPerPoller = kRingWaitAnyMax - 1;  // and the poller's own wake word
// Threads running ReserveWrites (each may wait for the NVMe writer), and those
// running CommitWrite, AbortWrite and PrefetchStatus (none waits).
constexpr size_t kReserveWorkers = 4;
constexpr size_t kQuickWorkers = 2;

}  // namespace

struct RingServer::Ring {
  Ring(uint64_t id, RingMemory m) : session_id(id), mem(std::move(m)) {}
  const uint64_t session_id;
  const RingMemory mem;
  std::atomic<bool> ended{false};  // no longer served; ReapEnded forgets it
  uint32_t head = 0;               // its poller's: what it took (the shared sq_head is only told)
  LogLimiter bad_entries;
  // Ours, not the client's: a slot whose call is still being answered (a
  // Lookup promoting from NVMe). A client that submits it again is ignored.
  std::atomic<bool> busy[kRingDepth] = {};
};

namespace {

// Writes the answer to the call `seq` into `slot` and completes it
// (RingComplete); `resp`: a Lookup's answer; `message`: another op's response
// (neither for a ReleaseRead). The caller checked that `message` fits the
// data area. Returns false when the client had given up on the call first:
// the caller then undoes it.
bool Answer(RingServer::Ring& ring, uint32_t slot, uint32_t seq, const Status& st,
            const core::LookupResponse* resp,
            const google::protobuf::MessageLite* message = nullptr) {
  RingSlot& s = ring.mem.slot(slot);
  const std::span<uint8_t> data = ring.mem.data(slot);
  RingCompletion c;
  c.seq = seq;
  // As the gRPC path maps it (IO_ERROR is INTERNAL on the wire).
  c.code =
      static_cast<int32_t>(st.code() == StatusCode::kIOError ? StatusCode::kInternal : st.code());
  if (!st.ok()) {
    c.message_bytes =
        static_cast<uint32_t>(std::min<size_t>(st.message().size(), kRingMaxMessageBytes));
    std::memcpy(data.data(), st.message().data(), c.message_bytes);
  } else if (message != nullptr) {
    c.message_bytes = static_cast<uint32_t>(message->ByteSizeLong());
    message->SerializeToArray(data.data(), static_cast<int>(c.message_bytes));
  } else if (resp != nullptr) {
    c.num_chunks = resp->num_chunks;
    c.cached_tokens = resp->cached_tokens;
    c.lease_id = resp->lease_id;
    c.lease_ttl_ms = resp->lease_ttl_ms;
    c.nvme_chunks = resp->nvme_chunks;
    c.prefetched_chunks = resp->prefetched_chunks;
    c.hbm_chunks = resp->hbm_chunks;
    c.remote_chunks = resp->remote_chunks;
    // max_chunks was bounded by kRingMaxLocations (DecodeLookup)
    c.location_count =
        static_cast<uint32_t>(std::min<size_t>(resp->chunks.size(), kRingMaxLocations));
    for (uint32_t i = 0; i < c.location_count; ++i) {
      const core::ChunkLocation& l = resp->chunks[i];
      const RingLocation loc{l.payload_offset, l.payload_bytes, l.sequence, l.hbm_payload_offset,
                             l.hbm_sequence};
      std::memcpy(data.data() + i * sizeof(RingLocation), &loc, sizeof(loc));
    }
  }
  std::memcpy(&s.completion, &c, sizeof(c));
  ring.busy[slot].store(false);  // before `done`: the client may reuse the slot once it sees it
  return RingComplete(s, seq);
}

// Parses ops 3-6's request from `call`, gives it the ring's session (and
// epoch), runs it and answers. `undo` takes back what the call did when its
// response would not fit the slot (then RESOURCE_EXHAUSTED) or its client
// gave up on it meanwhile. A call its client gave up on before it ran is not
// run: `given_up` does what that call still owes (a given-up CommitWrite
// leaves its reservation to be aborted; a given-up AbortWrite is still due).
template <typename Request, typename Response, typename Run, typename Undo, typename GivenUp>
void RunMessage(RingServer::Ring& ring, uint32_t slot, const RingCall& call, uint64_t session_id,
                uint64_t epoch, Run run, Undo undo, GivenUp given_up) {
  Request req;
  if (!req.ParseFromString(call.message)) {
    (void)Answer(
        ring, slot, call.seq,
        Status::InvalidArgument("ring entry op " + std::to_string(static_cast<uint32_t>(call.op)) +
                                ": not a " + req.GetTypeName()),
        nullptr);
    return;
  }
  req.set_session_id(session_id);
  if constexpr (requires { req.set_epoch(epoch); }) req.set_epoch(epoch);
  if (ring.mem.slot(slot).done.load() == kRingGivenUp) {
    given_up(req);
    (void)Answer(ring, slot, call.seq, Status(StatusCode::kCancelled, "given up by the client"),
                 nullptr);
    return;
  }
  Response resp;
  Status st = run(req, &resp);
  if (st.ok() && resp.ByteSizeLong() > kRingSlotDataBytes) {
    undo(resp);
    st = Status::ResourceExhausted("the " + resp.GetTypeName() + " is " +
                                   std::to_string(resp.ByteSizeLong()) +
                                   " bytes, more than a ring slot holds; send it over gRPC");
  }
  if (!Answer(ring, slot, call.seq, st, nullptr, &resp) && st.ok()) undo(resp);
}

}  // namespace

struct RingServer::Poller {
  std::thread thread;
  // Bumped (and woken) when a ring is handed to this poller, or at Stop.
  std::atomic<uint32_t> wake{0};
  std::mutex mu;
  std::vector<std::shared_ptr<Ring>> added;  // handed over, not yet taken; GUARDED_BY(mu)
  std::atomic<size_t> rings{0};              // handed to it and not yet closed
};

RingServer::RingServer(CacheCore& core, int listen_fd, PeerPolicy peers)
    : core_(core),
      listen_fd_(listen_fd),
      peers_(peers),
      reserves_(kReserveWorkers, /*one_per_key=*/true),
      quick_(kQuickWorkers, /*one_per_key=*/false) {
  accept_thread_ = std::thread([this] { AcceptLoop(); });
}

RingServer::~RingServer() { Stop(); }

void RingServer::Stop() {
  if (stopping_.exchange(true)) return;
  if (accept_thread_.joinable()) accept_thread_.join();
  close(listen_fd_);
  std::vector<std::unique_ptr<Poller>> pollers;
  {
    std::lock_guard lock(mu_);
    pollers.swap(pollers_);
    rings_.clear();
  }
  for (auto& p : pollers) {
    p->wake.fetch_add(1);
    RingFutexWake(p->wake);
    p->thread.join();  // it closes its rings on the way out
  }
  reserves_.Stop();  // each after answering what the pollers handed it
  quick_.Stop();
}

void RingServer::AcceptLoop() {
  LogLimiter refusals, crowded;
  // Connections waiting for their RingHello, served as each arrives: a peer
  // that connects and stays silent holds up no one else.
  // Each hello's bytes are taken off its socket as they come (a peek would
  // leave them there, and poll would wake this loop at once, again and again).
  struct Waiting {
    int fd;
    SteadyTime::time_point since;
    RingHello hello;
    size_t got = 0;
  };
  std::vector<Waiting> waiting;
  std::vector<pollfd> pfds;
  while (!stopping_.load()) {
    ReapEnded();
    pfds.assign(1, pollfd{listen_fd_, POLLIN, 0});
    for (const Waiting& w : waiting) pfds.push_back({w.fd, POLLIN, 0});
    if (poll(pfds.data(), pfds.size(), 20) < 0) {
      if (errno != EINTR) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    const auto now = SteadyTime::now();
    std::vector<Waiting> still;
    for (size_t i = 0; i < waiting.size(); ++i) {
      Waiting& w = waiting[i];
      const short ev = pfds[i + 1].revents;
      bool dead = (ev & (POLLHUP | POLLERR)) != 0 && (ev & POLLIN) == 0;
      if ((ev & POLLIN) != 0) {
        const ssize_t n = recv(w.fd, reinterpret_cast<char*>(&w.hello) + w.got,
                               sizeof(w.hello) - w.got, MSG_DONTWAIT);
        if (n > 0) w.got += static_cast<size_t>(n);
        dead = n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR);
      }
      if (w.got == sizeof(w.hello)) {
        Handshake(w.fd, w.hello);
      } else if (!dead && now - w.since < std::chrono::milliseconds(kHelloTimeoutMs)) {
        still.push_back(w);  // nothing, or part of a hello, yet
        continue;
      } else if (!dead) {
        Refuse(w.fd, Status::InvalidArgument("no RingHello within " +
                                             std::to_string(kHelloTimeoutMs) + " ms"));
      }
      close(w.fd);
    }
    waiting.swap(still);
    if ((pfds[0].revents & POLLIN) == 0) continue;
    const int conn = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) {
      if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) {
        std::this_thread::sleep_for(kIdleCheck);  // out of fds: the backlog waits
      }
      continue;
    }
    if (Status allowed = peers_.Check(conn); !allowed.ok()) {
      if (auto held_back = refusals.Admit()) {
        spdlog::warn("ring socket: refused a peer: {}{}", allowed.message(), HeldBack(*held_back));
      }
      close(conn);
      continue;
    }
    if (waiting.size() >= kMaxWaiting) {
      if (auto held_back = crowded.Admit()) {
        spdlog::warn(
            "ring socket: {} connections wait for their hello; refused one more (its "
            "client uses gRPC){}",
            waiting.size(), HeldBack(*held_back));
      }
      Refuse(conn, Status::ResourceExhausted("too many connections wait for their hello"));
      close(conn);
      continue;
    }
    waiting.push_back({conn, SteadyTime::now(), RingHello{}, 0});
  }
  for (const Waiting& w : waiting) close(w.fd);
}

void RingServer::Refuse(int conn, const Status& st) {
  RingAnnouncement answer;
  answer.code = static_cast<int32_t>(st.code());
  std::strncpy(answer.message, st.message().c_str(), sizeof(answer.message) - 1);
  (void)send(conn, &answer, sizeof(answer), MSG_NOSIGNAL | MSG_DONTWAIT);
}

void RingServer::Handshake(int conn, const RingHello& hello) {
  RingAnnouncement answer;
  auto refuse = [&](const Status& st) { Refuse(conn, st); };
  if (hello.magic != kRingHelloMagic || hello.version != kRingVersion) {
    return refuse(Status::InvalidArgument(
        "RingHello magic or version " + std::to_string(hello.version) + " is not this kvtierd's"));
  }
  const std::string want = core_.SessionToken(hello.session_id);  // one look: no race with its end
  if (want.empty()) {
    return refuse(
        Status::FailedPrecondition("session " + std::to_string(hello.session_id) + " is unknown"));
  }
  uint8_t diff = want.size() == sizeof(hello.session_token) ? 0 : 1;
  for (size_t i = 0; i < sizeof(hello.session_token); ++i) {  // constant time
    diff |= static_cast<uint8_t>(hello.session_token[i] ^ (i < want.size() ? want[i] : 0));
  }
  if (diff != 0) {
    return refuse(Status::PermissionDenied("a wrong session token for session " +
                                           std::to_string(hello.session_id)));
  }
  std::shared_ptr<Ring> ring;
  size_t rings = 0;
  {
    std::lock_guard lock(mu_);
    if (auto it = rings_.find(hello.session_id); it != rings_.end()) ring = it->second;
    rings = rings_.size();
  }
  if (!ring) {
    if (rings >= kMaxRings) {  // the client uses gRPC instead
      return refuse(Status::ResourceExhausted(std::to_string(rings) + " rings are open"));
    }
    auto mem = RingMemory::Create(hello.session_id);
    if (!mem.ok()) {
      spdlog::warn("control ring for session {}: {}", hello.session_id, mem.status().ToString());
      return refuse(mem.status());
    }
    ring = std::make_shared<Ring>(hello.session_id, std::move(mem).value());
    if (Status st = Assign(ring); !st.ok()) return refuse(st);
  }
  if (Status st = SendFd(conn, &answer, sizeof(answer), ring->mem.fd()); !st.ok()) {
    spdlog::debug("control ring for session {}: {}", hello.session_id, st.ToString());
  }
}

Status RingServer::Assign(const std::shared_ptr<Ring>& ring) {
  std::lock_guard lock(mu_);
  Poller* least = nullptr;
  for (auto& p : pollers_) {
    if (least == nullptr || p->rings < least->rings) least = p.get();
  }
  // A new poller while there are fewer than kPollers, or all are full.
  if (least == nullptr || (least->rings > 0 && pollers_.size() < kPollers) ||
      least->rings >= kRingsPerPoller) {
    auto p = std::make_unique<Poller>();
    try {
      p->thread = std::thread([this, raw = p.get()] { Poll(*raw); });
    } catch (const std::system_error& e) {  // out of threads: this session goes over gRPC
      return Status::ResourceExhausted(std::string("no thread to serve the ring: ") + e.what());
    }
    least = p.get();
    pollers_.push_back(std::move(p));
  }
  ++least->rings;
  rings_.emplace(ring->session_id, ring);
  {
    std::lock_guard added(least->mu);
    least->added.push_back(ring);
  }
  least->wake.fetch_add(1);
  RingFutexWake(least->wake);
  return Status::Ok();
}

void RingServer::ReapEnded() {
  std::lock_guard lock(mu_);
  for (auto it = rings_.begin(); it != rings_.end();) {
    it = it->second->ended.load() ? rings_.erase(it) : std::next(it);
  }
}

bool RingServer::Serve(const std::shared_ptr<Ring>& shared) {
  Ring& ring = *shared;
  RingHeader& h = ring.mem.header();
  const uint32_t tail = h.sq_tail.load(std::memory_order_acquire);
  if (tail == ring.head) return false;
  if (tail - ring.head > kRingDepth) {
    spdlog::warn(
        "control ring of session {}: its tail ran {} entries ahead of what kvtierd "
        "took (at most {}): the ring is no longer served; its client uses gRPC",
        ring.session_id, tail - ring.head, kRingDepth);
    ring.ended.store(true);
    return false;
  }
  for (; ring.head != tail; ++ring.head) {
    const uint32_t slot = h.sq[ring.head % kRingDepth].load(std::memory_order_acquire);
    h.sq_head.store(ring.head + 1, std::memory_order_release);
    Submit(shared, slot);
  }
  return true;
}

void RingServer::Poll(Poller& p) {
  std::vector<std::shared_ptr<Ring>> rings;
  auto close_ring = [&p](Ring& ring) {
    RingHeader& h = ring.mem.header();
    h.closed.store(1);
    RingFutexWake(h.sq_tail);
    for (uint32_t i = 0; i < kRingDepth; ++i) RingFutexWake(ring.mem.slot(i).done);
    ring.ended.store(true);
    p.rings.fetch_sub(1);
  };
  auto take_added = [&p, &rings] {
    std::lock_guard lock(p.mu);
    for (auto& r : p.added) rings.push_back(std::move(r));
    p.added.clear();
  };
  std::vector<std::atomic<uint32_t>*> words;
  std::vector<uint32_t> expected;
  auto last_work = SteadyTime::now();
  auto last_check = last_work;
  while (!stopping_.load(std::memory_order_relaxed)) {
    const uint32_t wake = p.wake.load();
    take_added();
    auto now = SteadyTime::now();
    const bool check = now - last_check >= kIdleCheck;  // busy or not
    if (check) last_check = now;
    bool worked = false;
    for (size_t i = 0; i < rings.size();) {
      Ring& ring = *rings[i];
      if (check && core_.SessionToken(ring.session_id).empty()) ring.ended.store(true);
      if (!ring.ended.load()) worked = Serve(rings[i]) || worked;
      if (ring.ended.load()) {  // its session ended, or it ran away
        close_ring(ring);
        rings[i] = std::move(rings.back());
        rings.pop_back();
        continue;
      }
      ++i;
    }
    now = SteadyTime::now();
    if (worked) {
      last_work = now;
      continue;
    }
    if (now - last_work < kSpin) {
      RingSpinStep();
      continue;
    }
    // Sleep until a client rings (it wakes sq_tail when daemon_idle is set),
    // a ring is added, or it is time to look for ended sessions. Look again
    // after setting daemon_idle: a client that saw 0 did not wake us.
    words.assign(1, &p.wake);
    expected.assign(1, wake);
    bool ready = false;
    for (auto& r : rings) {
      RingHeader& h = r->mem.header();
      h.daemon_idle.store(1);
      ready = ready || h.sq_tail.load() != r->head;
      if (words.size() < kRingWaitAnyMax) {
        words.push_back(&h.sq_tail);
        expected.push_back(r->head);
      }
    }
    if (!ready) RingFutexWaitAny(words, expected, kIdleCheck);
    for (auto& r : rings) r->mem.header().daemon_idle.store(0, std::memory_order_relaxed);
  }
  take_added();
  for (auto& r : rings) close_ring(*r);
}

void RingServer::Submit(const std::shared_ptr<Ring>& ring, uint32_t slot) {
  core_.CountRingCall();     // every call that came, run or not (given up, malformed)
  if (slot >= kRingDepth) {  // no slot to answer into
    if (auto held_back = ring->bad_entries.Admit()) {
      spdlog::warn("control ring of session {}: slot index {} is past its {} slots{}",
                   ring->session_id, slot, kRingDepth, HeldBack(*held_back));
    }
    return;
  }
  if (ring->busy[slot].exchange(true)) {  // its last call is still being answered
    if (auto held_back = ring->bad_entries.Admit()) {
      spdlog::warn("control ring of session {}: slot {} submitted again before its answer{}",
                   ring->session_id, slot, HeldBack(*held_back));
    }
    return;
  }
  RingSubmission entry;
  std::memcpy(&entry, &ring->mem.slot(slot).submission, sizeof(entry));
  const bool given_up = ring->mem.slot(slot).done.load() == kRingGivenUp;
  if (given_up && entry.op == static_cast<uint32_t>(RingOp::kLookup)) {
    // Given up before we took it: not run, and its prompt not even copied out.
    (void)Answer(*ring, slot, entry.seq, Status(StatusCode::kCancelled, "given up by the client"),
                 nullptr);
    return;
  }
  auto call = DecodeSubmission(entry, ring->mem.data(slot));
  if (!call.ok()) {
    (void)Answer(*ring, slot, entry.seq, call.status(), nullptr);
    return;
  }
  const uint64_t session = ring->session_id;
  const uint64_t epoch = core_.epoch();
  switch (call->op) {
    case RingOp::kLookup:
      break;
    case RingOp::kReleaseRead:  // still due when given up
      (void)Answer(*ring, slot, call->seq, core_.ReleaseRead(session, call->lease_id), nullptr);
      return;
    case RingOp::kReserveWrite:
    case RingOp::kCommitWrite:
    case RingOp::kAbortWrite:
    case RingOp::kPrefetchStatus:
      // Off the poller: a ReserveWrite may wait for the NVMe writer
      // (write-through backpressure), which must not hold up other rings,
      // nor any other session's call.
      return (call->op == RingOp::kReserveWrite ? reserves_ : quick_)
          .Defer(session, [this, ring, slot, call = std::move(*call), session, epoch] {
            RunMessageOp(ring, slot, call, session, epoch);
          });
  }
  auto resp = std::make_shared<core::LookupResponse>();
  // The core outlives its I/O workers, which may run this after Stop().
  core_.Lookup({.session_id = session,  // the ring's own: a client cannot name another session
                .epoch = epoch,
                .namespace_id = call->namespace_id,
                .tokens = call->tokens,
                .acquire = call->acquire,
                .max_chunks = call->max_chunks,
                .prefetch_ticket = call->prefetch_ticket,
                .hbm = call->hbm,
                .request_id = call->request_id,
                .first_chunk = call->first_chunk,
                .adopt_ticket = call->adopt_ticket},
               resp.get(), [ring, slot, seq = call->seq, resp, core = &core_](Status st) {
                 if (st.ok()) core->CountRingLookup();
                 if (!Answer(*ring, slot, seq, st, resp.get()) && st.ok() && resp->lease_id != 0) {
                   // its client gave up waiting, as a cancelled RPC
                   (void)core->ReleaseUnserved(ring->session_id, resp->lease_id);
                 }
               });
}

void RingServer::RunMessageOp(const std::shared_ptr<Ring>& ring, uint32_t slot,
                              const RingCall& call, uint64_t session, uint64_t epoch) {
  auto nothing = [](const auto&) {};
  auto abort = [&](uint64_t reservation_id) {
    if (reservation_id != 0) (void)core_.AbortWrite(session, reservation_id);
  };
  switch (call.op) {
    case RingOp::kReserveWrite:
      return RunMessage<v1::ReserveWriteRequest, v1::ReserveWriteResponse>(
          *ring, slot, call, session, epoch,
          [&](const auto& req, auto* resp) { return wire::Run(core_, req, resp); },
          // its client never sees the reservation
          [&](const v1::ReserveWriteResponse& resp) { abort(resp.reservation_id()); }, nothing);
    case RingOp::kCommitWrite:
      // A commit its client gave up on before it ran: the client reported the
      // chunks dropped, so the reservation ends now rather than at its TTL
      // (meanwhile its keys could be stored by no one). One that ran stays
      // committed: its payloads were written in full before the call.
      return RunMessage<v1::CommitWriteRequest, v1::CommitWriteResponse>(
          *ring, slot, call, session, epoch,
          [&](const auto& req, auto* resp) { return wire::Run(core_, req, resp); }, nothing,
          [&](const v1::CommitWriteRequest& req) { abort(req.reservation_id()); });
    case RingOp::kAbortWrite:
      return RunMessage<v1::AbortWriteRequest, v1::AbortWriteResponse>(
          *ring, slot, call, session, epoch,
          [&](const auto& req, auto*) { return wire::Run(core_, req); }, nothing,
          [&](const v1::AbortWriteRequest& req) { abort(req.reservation_id()); });
    case RingOp::kPrefetchStatus:
      return RunMessage<v1::PrefetchStatusRequest, v1::PrefetchStatusResponse>(
          *ring, slot, call, session, epoch,
          [&](const auto& req, auto* resp) { return wire::Run(core_, req, resp); }, nothing,
          nothing);
    case RingOp::kLookup:
    case RingOp::kReleaseRead:
      break;  // the poller's own
  }
}

RingServer::Workers::Workers(size_t threads, bool one_per_key) : one_per_key_(one_per_key) {
  for (size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { Work(); });
}

void RingServer::Workers::Defer(uint64_t key, std::function<void()> job) {
  {
    std::lock_guard lock(mu_);
    jobs_.emplace_back(key, std::move(job));
  }
  cv_.notify_all();  // not one: the woken worker may find only a busy session's job
}

void RingServer::Workers::Stop() {
  {
    std::lock_guard lock(mu_);
    if (stop_ && threads_.empty()) return;
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

void RingServer::Workers::Work() {
  std::unique_lock lock(mu_);
  for (;;) {
    auto next = jobs_.end();
    cv_.wait(lock, [&] {
      next = std::find_if(jobs_.begin(), jobs_.end(), [&](const auto& j) {
        return !one_per_key_ || running_.count(j.first) == 0;
      });
      return next != jobs_.end() || (stop_ && jobs_.empty());
    });
    if (next == jobs_.end()) return;  // stopping, and every call taken is answered
    const uint64_t key = next->first;
    std::function<void()> job = std::move(next->second);
    jobs_.erase(next);
    ++running_[key];
    lock.unlock();
    job();
    lock.lock();
    if (--running_[key] == 0) running_.erase(key);
    if (one_per_key_) cv_.notify_all();  // that session's next job may run now
  }
}

}  // namespace kvtier
