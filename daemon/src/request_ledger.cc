#include "kvtier/daemon/request_ledger.h"

#include <algorithm>

namespace kvtier {

std::pair<uint64_t*, bool> RequestLedger::Remember(const std::string& key) {
  if (auto it = credited_.find(key); it != credited_.end()) return {&it->second, false};
  if (credited_.size() >= capacity_) {
    credited_.erase(order_.front());
    order_.pop_front();
  }
  order_.push_back(key);
  return {&credited_.emplace(key, 0).first->second, true};
}

bool RequestLedger::FirstSight(const std::string& key) {
  return key.empty() || Remember(key).second;
}

uint64_t RequestLedger::Credit(const std::string& key, uint64_t served) {
  if (key.empty()) return 0;
  uint64_t* credited = Remember(key).first;
  const uint64_t before = *credited;
  *credited = std::max(*credited, served);
  return before;
}

}  // namespace kvtier
