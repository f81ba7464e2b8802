// OwnedTable: the grants of one kind (leases, reservations) that sessions
// hold, by id, each bound to the session that made it.
//
// A session can take only its own grants: the id of another session's grant
// is PERMISSION_DENIED and leaves it in place. A session's grants are indexed
// by session, so ending a session costs what that session holds, not what all
// sessions hold.
//
// Thread-safety: none; CacheCore guards it with its mutex.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "kvtier/clock.h"
#include "kvtier/status.h"

namespace kvtier {

// The entry `id` of `map` (of grants with a `session_id`) when it belongs to
// `session_id`. Errors: NOT_FOUND (`gone` says how it may have ended),
// PERMISSION_DENIED for another session's id.
template <typename Map>
Result<typename Map::iterator> FindOwned(Map& map, uint64_t id, uint64_t session_id,
                                         const char* field, const char* gone) {
  auto it = map.find(id);
  if (it == map.end()) {
    return Status::NotFound(std::string(field) + " " + std::to_string(id) + " is unknown (" + gone +
                            ")");
  }
  if (it->second.session_id != session_id) {
    return Status::PermissionDenied(std::string(field) + " " + std::to_string(id) +
                                    " belongs to another session");
  }
  return it;
}

// T has `uint64_t session_id` and `Clock::TimePoint expiry`.
template <typename T>
class OwnedTable {
 public:
  // `field`: the request field that names a grant ("lease_id"); `gone`: how a
  // grant may have ended, for NOT_FOUND ("released, expired or never granted").
  OwnedTable(const char* field, const char* gone) : field_(field), gone_(gone) {}

  // REQUIRES: `id` is not in the table.
  void Add(uint64_t id, T grant) {
    by_session_[grant.session_id].insert(id);
    grants_.emplace(id, std::move(grant));
  }

  // Takes grant `id` out of the table. Errors as FindOwned (the table is then unchanged).
  Result<T> Take(uint64_t id, uint64_t session_id) {
    auto it = FindOwned(grants_, id, session_id, field_, gone_);
    if (!it.ok()) return it.status();
    return Remove(*it);
  }

  // Takes every grant of `session_id` out of the table.
  std::vector<T> TakeSession(uint64_t session_id) {
    std::vector<T> taken;
    auto s = by_session_.find(session_id);
    if (s == by_session_.end()) return taken;
    const std::unordered_set<uint64_t> ids = std::move(s->second);
    by_session_.erase(s);
    taken.reserve(ids.size());
    for (uint64_t id : ids) {
      auto it = grants_.find(id);
      taken.push_back(std::move(it->second));
      grants_.erase(it);
    }
    return taken;
  }

  // Takes every grant whose expiry is at or before `now` out of the table.
  std::vector<T> TakeExpired(Clock::TimePoint now) {
    std::vector<T> taken;
    for (auto it = grants_.begin(); it != grants_.end();) {
      auto next = std::next(it);
      if (it->second.expiry <= now) taken.push_back(Remove(it));
      it = next;
    }
    return taken;
  }

  size_t size() const { return grants_.size(); }

 private:
  T Remove(typename std::unordered_map<uint64_t, T>::iterator it) {
    auto s = by_session_.find(it->second.session_id);
    s->second.erase(it->first);
    if (s->second.empty()) by_session_.erase(s);
    T grant = std::move(it->second);
    grants_.erase(it);
    return grant;
  }

  const char* const field_;
  const char* const gone_;
  std::unordered_map<uint64_t, T> grants_;
  std::unordered_map<uint64_t, std::unordered_set<uint64_t>> by_session_;
};

}  // namespace kvtier
