// CacheCore's sessions: opening and ending them, their tokens, and what each
// may hold of the DRAM arena (session_max_bytes).
#include <spdlog/spdlog.h>
#include <sys/random.h>

#include <algorithm>

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
                                    std::move(token)});
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

void CacheCore::EndSession(uint64_t session_id) {
  std::lock_guard lock(mu_);
  if (sessions_.erase(session_id) == 0) return;
  const std::vector<Lease> leases = leases_.TakeSession(session_id);
  for (const Lease& lease : leases) EndLease(lease);
  std::vector<Reservation> open = reservations_.TakeSession(session_id);
  for (Reservation& r : open) FreeReservation(r);
  size_t reservations = open.size();
  counters_.prefetches.session_ended += promoter_->EndSession(session_id);
  if (auto q = quarantined_.find(session_id); q != quarantined_.end()) {
    for (const Reservation& r : q->second) FreeReservationSlots(r);
    reservations += q->second.size();
    quarantined_.erase(q);
  }
  spdlog::debug("session {} ended: freed {} leases and {} reservations", session_id,
                leases.size(), reservations);
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
