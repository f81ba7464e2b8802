#include "kvtier/daemon/request_ledger.h"

#include <algorithm>

namespace kvtier {

std::pair<RequestLedger::Entry*, bool> RequestLedger::Remember(const std::string& key) {
  if (auto it = credited_.find(key); it != credited_.end()) return {&it->second, false};
  if (credited_.size() >= capacity_) {
    credited_.erase(order_.front());
    order_.pop_front();
  }
  order_.push_back(key);
  return {&credited_.emplace(key, Entry{}).first->second, true};
}

bool RequestLedger::FirstSight(const std::string& key, uint64_t prompt_chunks) {
  if (key.empty()) return true;
  auto [entry, fresh] = Remember(key);
  if (fresh) entry->prompt_chunks = prompt_chunks;
  return fresh;
}

RequestLedger::Range RequestLedger::Credit(const std::string& key, uint64_t served) {
  if (key.empty()) return {0, served};
  Entry* entry = Remember(key).first;
  const uint64_t from = entry->credited;
  entry->credited = std::max(from, std::min(served, entry->prompt_chunks));
  return {from, entry->credited};
}

void RequestLedger::Uncredit(const std::string& key, Range credited) {
  if (key.empty()) return;
  auto it = credited_.find(key);
  if (it != credited_.end() && it->second.credited == credited.to) {
    it->second.credited = credited.from;
  }
}

}  // namespace kvtier
