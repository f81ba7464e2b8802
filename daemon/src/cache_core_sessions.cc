// CacheCore's sessions: opening and ending them, their tokens, and what each
// may hold of the DRAM arena (session_max_bytes).
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "kvtier/daemon/cache_core.h"

namespace kvtier {

uint64_t CacheCoreOptions::SessionMaxBytes() const {
  return session_max_bytes != 0 ? session_max_bytes : dram_bytes / 2;
}

size_t CacheCore::SessionAllowance(uint64_t session_id, uint64_t slot_bytes,
                                   uint64_t returning) const {
  auto it = sessions_.find(session_id);
  if (it == sessions_.end() || slot_bytes == 0) return 0;
  const uint64_t held = it->second.held_bytes - std::min(returning, it->second.held_bytes);
  if (held == 0) return std::max<uint64_t>(1, options_.SessionMaxBytes() / slot_bytes);
  const uint64_t limit = options_.SessionMaxBytes();
  return held >= limit ? 0 : static_cast<size_t>((limit - held) / slot_bytes);
}

void CacheCore::Hold(uint64_t session_id, uint64_t bytes) {
  if (auto it = sessions_.find(session_id); it != sessions_.end()) it->second.held_bytes += bytes;
}

void CacheCore::Drop(uint64_t session_id, uint64_t bytes) {
  if (auto it = sessions_.find(session_id); it != sessions_.end()) {
    it->second.held_bytes -= std::min(bytes, it->second.held_bytes);
  }
}

uint64_t CacheCore::OpenSession(const std::string& client_name, uint32_t pid) {
  uint8_t random[16];
  for (size_t got = 0; got < sizeof(random);) {  // the kernel's CSPRNG; blocks only at early boot
    const ssize_t n = getrandom(random + got, sizeof(random) - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string token;
  for (uint8_t b : random) {
    token += kHex[b >> 4];
    token += kHex[b & 15];
  }
  std::lock_guard lock(mu_);
  uint64_t id = next_id_++;
  sessions_.emplace(id, SessionInfo{client_name + " (pid " + std::to_string(pid) + ")",
                                    std::move(token), 0, pid});
  return id;
}

std::string CacheCore::SessionToken(uint64_t session_id) const {
  std::lock_guard lock(mu_);
  auto it = sessions_.find(session_id);
  return it == sessions_.end() ? std::string() : it->second.token;
}

Status CacheCore::CheckSessionToken(uint64_t session_id, std::string_view token) const {
  std::lock_guard lock(mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return Status::Ok();
  const std::string& want = it->second.token;
  uint8_t diff = token.size() == want.size() ? 0 : 1;
  for (size_t i = 0; i < want.size(); ++i) {
    diff |= static_cast<uint8_t>(want[i] ^ (i < token.size() ? token[i] : 0));
  }
  if (diff == 0) return Status::Ok();
  return Status::PermissionDenied("session_id " + std::to_string(session_id) + ": " +
                                  (token.empty() ? "no" : "a wrong") +
                                  " session token (metadata kvtier-session-token); a session's "
                                  "leases, reservations and tickets are its own");
}

void CacheCore::EndSession(uint64_t session_id, bool writers_stopped) {
  std::lock_guard lock(mu_);
  auto session = sessions_.find(session_id);
  if (session == sessions_.end()) return;
  const SessionInfo info = std::move(session->second);
  sessions_.erase(session);
  const std::vector<Lease> leases = leases_.TakeSession(session_id);
  for (const Lease& lease : leases) EndLease(lease);
  std::vector<Reservation> open = reservations_.TakeSession(session_id);
  for (Reservation& r : open) ReleaseReservationHolds(r);  // their keys, at once
  counters_.prefetches.session_ended += promoter_->EndSession(session_id);
  if (auto q = quarantined_.find(session_id); q != quarantined_.end()) {
    for (Reservation& r : q->second) open.push_back(std::move(r));
    quarantined_.erase(q);
  }
  const size_t reservations = open.size();
  // Their slots: the client may still be copying into them while it runs.
  int pidfd = -1;
  bool running = false;
  if (!open.empty() && info.pid != 0 && !writers_stopped) {
    pidfd = static_cast<int>(syscall(SYS_pidfd_open, static_cast<pid_t>(info.pid), 0));
    if (pidfd >= 0) {
      pollfd p{pidfd, POLLIN, 0};
      running = poll(&p, 1, 0) == 0;  // readable: it exited already (a zombie)
      if (!running) close(pidfd);
    } else {
      running = errno != ESRCH && kill(static_cast<pid_t>(info.pid), 0) == 0;
    }
  }
  if (running) {
    spdlog::info(
        "session {} of {} ended while its process runs: the slots of its {} open "
        "reservations stay held until it exits (it may still be writing them)",
        session_id, info.name, reservations);
    orphans_.push_back({pidfd, info.pid, std::move(open)});
  } else {
    for (const Reservation& r : open) FreeReservationSlots(r);
  }
  spdlog::debug("session {} ended: freed {} leases and {} reservations", session_id, leases.size(),
                running ? 0 : reservations);
}

void CacheCore::ReapOrphans() {
  std::erase_if(orphans_, [&](Orphans& o) {
    bool exited;
    if (o.pidfd >= 0) {
      pollfd p{o.pidfd, POLLIN, 0};
      exited = poll(&p, 1, 0) != 0;  // readable once it exited (or an error: give up on it)
    } else {
      exited = kill(static_cast<pid_t>(o.pid), 0) != 0 && errno == ESRCH;
    }
    if (!exited) return false;
    for (const Reservation& r : o.reservations) FreeReservationSlots(r);
    spdlog::info("process {} exited: the slots of its {} orphaned reservations are free", o.pid,
                 o.reservations.size());
    if (o.pidfd >= 0) close(o.pidfd);
    return true;
  });
}

Status CacheCore::CheckSession(uint64_t session_id) const {
  if (sessions_.count(session_id) == 0) {
    return Status::FailedPrecondition("session_id " + std::to_string(session_id) +
                                      " is unknown (open a Session stream first)");
  }
  return Status::Ok();
}

Status CacheCore::CheckEpoch(uint64_t epoch) const {
  if (epoch != dram_->arena().epoch()) {
    return Status::FailedPrecondition("epoch " + std::to_string(epoch) +
                                      " is stale (the daemon restarted; remap the arena)");
  }
  return Status::Ok();
}

}  // namespace kvtier
