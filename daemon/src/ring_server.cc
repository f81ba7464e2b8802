#include "ring_server.h"

#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

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

inline void CpuRelax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

struct RingServer::Ring {
  Ring(uint64_t id, RingMemory m) : session_id(id), mem(std::move(m)) {}
  const uint64_t session_id;
  const RingMemory mem;
  std::atomic<bool> ended{false};  // its thread returned; ReapEnded joins it
  std::thread thread;
  LogLimiter bad_entries;
};

namespace {

// Writes the answer to the call `seq` into `slot` and wakes its client;
// `resp`: a Lookup's answer (null for a ReleaseRead).
void Answer(RingServer::Ring& ring, uint32_t slot, uint32_t seq, const Status& st,
            const v1::LookupResponse* resp) {
  RingSlot& s = ring.mem.slot(slot);
  const std::span<uint8_t> data = ring.mem.data(slot);
  RingCompletion c;
  c.seq = seq;
  c.code = static_cast<int32_t>(st.code());
  if (!st.ok()) {
    c.message_bytes = static_cast<uint32_t>(std::min<size_t>(st.message().size(), kRingMaxMessageBytes));
    std::memcpy(data.data(), st.message().data(), c.message_bytes);
  } else if (resp != nullptr) {
    c.num_chunks = resp->num_chunks();
    c.cached_tokens = resp->cached_tokens();
    c.lease_id = resp->lease_id();
    c.lease_ttl_ms = resp->lease_ttl_ms();
    c.nvme_chunks = resp->nvme_chunks();
    c.prefetched_chunks = resp->prefetched_chunks();
    c.hbm_chunks = resp->hbm_chunks();
    // max_chunks was bounded by kRingMaxLocations (DecodeLookup)
    c.location_count = static_cast<uint32_t>(std::min<int>(resp->chunks_size(), kRingMaxLocations));
    for (uint32_t i = 0; i < c.location_count; ++i) {
      const v1::ChunkLocation& l = resp->chunks(static_cast<int>(i));
      const RingLocation loc{l.payload_offset(), l.payload_bytes(), l.sequence(),
                             l.hbm_payload_offset()};
      std::memcpy(data.data() + i * sizeof(RingLocation), &loc, sizeof(loc));
    }
  }
  std::memcpy(&s.completion, &c, sizeof(c));
  s.done.store(seq, std::memory_order_release);
  RingFutexWake(s.done);
}

}  // namespace

RingServer::RingServer(CacheCore& core, int listen_fd, PeerPolicy peers)
    : core_(core), listen_fd_(listen_fd), peers_(peers) {
  accept_thread_ = std::thread([this] { AcceptLoop(); });
}

RingServer::~RingServer() { Stop(); }

void RingServer::Stop() {
  if (stopping_.exchange(true)) return;
  if (accept_thread_.joinable()) accept_thread_.join();
  close(listen_fd_);
  std::unordered_map<uint64_t, std::shared_ptr<Ring>> rings;
  {
    std::lock_guard lock(mu_);
    rings.swap(rings_);
  }
  for (auto& [id, ring] : rings) {
    RingFutexWake(ring->mem.header().sq_tail);
    if (ring->thread.joinable()) ring->thread.join();
  }
}

void RingServer::AcceptLoop() {
  LogLimiter refusals;
  while (!stopping_.load()) {
    ReapEnded();
    pollfd pfd{listen_fd_, POLLIN, 0};
    if (poll(&pfd, 1, static_cast<int>(kIdleCheck.count())) <= 0) continue;
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
    Handshake(conn);
    close(conn);
  }
}

void RingServer::Handshake(int conn) {
  RingAnnouncement answer;
  auto refuse = [&](const Status& st) {
    answer.code = static_cast<int32_t>(st.code());
    std::strncpy(answer.message, st.message().c_str(), sizeof(answer.message) - 1);
    (void)send(conn, &answer, sizeof(answer), MSG_NOSIGNAL);
  };
  RingHello hello;
  pollfd pfd{conn, POLLIN, 0};
  if (poll(&pfd, 1, kHelloTimeoutMs) <= 0 ||
      recv(conn, &hello, sizeof(hello), MSG_DONTWAIT | MSG_WAITALL) !=
          static_cast<ssize_t>(sizeof(hello))) {
    return refuse(Status::InvalidArgument("no RingHello within " +
                                          std::to_string(kHelloTimeoutMs) + " ms"));
  }
  if (hello.magic != kRingHelloMagic || hello.version != kRingVersion) {
    return refuse(Status::InvalidArgument("RingHello magic or version " +
                                          std::to_string(hello.version) + " is not this kvtierd's"));
  }
  const std::string_view token(hello.session_token, sizeof(hello.session_token));
  if (core_.SessionToken(hello.session_id).empty()) {
    return refuse(Status::FailedPrecondition("session " + std::to_string(hello.session_id) +
                                             " is unknown"));
  }
  if (Status st = core_.CheckSessionToken(hello.session_id, token); !st.ok()) return refuse(st);
  std::shared_ptr<Ring> ring;
  {
    std::lock_guard lock(mu_);
    if (auto it = rings_.find(hello.session_id); it != rings_.end()) ring = it->second;
  }
  if (!ring) {
    auto mem = RingMemory::Create(hello.session_id);
    if (!mem.ok()) {
      spdlog::warn("control ring for session {}: {}", hello.session_id, mem.status().ToString());
      return refuse(mem.status());
    }
    ring = std::make_shared<Ring>(hello.session_id, std::move(mem).value());
    ring->thread = std::thread([this, ring] { Serve(ring); });
    std::lock_guard lock(mu_);
    rings_.emplace(hello.session_id, ring);
  }
  if (Status st = SendFd(conn, &answer, sizeof(answer), ring->mem.fd()); !st.ok()) {
    spdlog::debug("control ring for session {}: {}", hello.session_id, st.ToString());
  }
}

void RingServer::ReapEnded() {
  std::vector<std::shared_ptr<Ring>> ended;
  {
    std::lock_guard lock(mu_);
    for (auto it = rings_.begin(); it != rings_.end();) {
      if (it->second->ended.load()) {
        ended.push_back(std::move(it->second));
        it = rings_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& ring : ended) ring->thread.join();
}

void RingServer::Serve(const std::shared_ptr<Ring>& ring) {
  RingHeader& h = ring->mem.header();
  uint32_t head = 0;  // ours: the shared sq_head is only told
  auto last_work = SteadyTime::now();
  auto last_check = last_work;
  while (!stopping_.load(std::memory_order_relaxed)) {
    const uint32_t tail = h.sq_tail.load(std::memory_order_acquire);
    if (tail == head) {
      const auto now = SteadyTime::now();
      if (now - last_check >= kIdleCheck) {
        last_check = now;
        if (core_.SessionToken(ring->session_id).empty()) break;  // the session ended
      }
      if (now - last_work < kSpin) {
        CpuRelax();
        continue;
      }
      h.daemon_idle.store(1);  // then look again: a client that saw 0 did not wake us
      if (h.sq_tail.load() == head) RingFutexWait(h.sq_tail, head, kIdleCheck);
      h.daemon_idle.store(0, std::memory_order_relaxed);
      continue;
    }
    if (tail - head > kRingDepth) {
      spdlog::warn("control ring of session {}: its tail ran {} entries ahead of what kvtierd "
                   "took (at most {}): the ring is no longer served; its client's calls time out "
                   "and fail open", ring->session_id, tail - head, kRingDepth);
      while (!stopping_.load() && !core_.SessionToken(ring->session_id).empty()) {
        std::this_thread::sleep_for(kIdleCheck);
      }
      break;
    }
    for (; head != tail; ++head) {
      const uint32_t slot = h.sq[head % kRingDepth].load(std::memory_order_acquire);
      h.sq_head.store(head + 1, std::memory_order_release);
      Submit(ring, slot);
    }
    last_work = SteadyTime::now();
  }
  ring->ended.store(true);
}

void RingServer::Submit(const std::shared_ptr<Ring>& ring, uint32_t slot) {
  if (slot >= kRingDepth) {  // no slot to answer into
    if (auto held_back = ring->bad_entries.Admit()) {
      spdlog::warn("control ring of session {}: slot index {} is past its {} slots{}",
                   ring->session_id, slot, kRingDepth, HeldBack(*held_back));
    }
    return;
  }
  RingSubmission entry;
  std::memcpy(&entry, &ring->mem.slot(slot).submission, sizeof(entry));
  auto call = DecodeSubmission(entry, ring->mem.data(slot));
  if (!call.ok()) return Answer(*ring, slot, entry.seq, call.status(), nullptr);
  if (call->op == RingOp::kReleaseRead) {
    v1::ReleaseReadRequest release;
    release.set_session_id(ring->session_id);
    release.set_lease_id(call->lease_id);
    return Answer(*ring, slot, call->seq, core_.ReleaseRead(release), nullptr);
  }
  core_.CountRingLookup();
  struct Job {
    v1::LookupRequest req;
    v1::LookupResponse resp;
  };
  auto job = std::make_shared<Job>();
  v1::LookupRequest& req = job->req;
  req.set_session_id(ring->session_id);  // the ring's own: a client cannot name another session
  req.set_epoch(core_.epoch());
  req.set_namespace_id(std::move(call->namespace_id));
  req.set_tokens(std::move(call->tokens));
  req.set_acquire(call->acquire);
  req.set_hbm(call->hbm);
  req.set_max_chunks(call->max_chunks);
  req.set_prefetch_ticket(call->prefetch_ticket);
  req.set_request_id(std::move(call->request_id));
  // The core outlives its I/O workers, which may run this after Stop().
  core_.Lookup(req, &job->resp, [ring, slot, seq = call->seq, job, core = &core_](Status st) {
    if (st.ok() && job->resp.lease_id() != 0 &&
        ring->mem.slot(slot).cancelled.load(std::memory_order_acquire) == seq) {
      v1::ReleaseReadRequest release;  // its client gave up waiting, as a cancelled RPC
      release.set_session_id(ring->session_id);
      release.set_lease_id(job->resp.lease_id());
      (void)core->ReleaseRead(release);
    }
    Answer(*ring, slot, seq, st, &job->resp);
  });
}

}  // namespace kvtier
