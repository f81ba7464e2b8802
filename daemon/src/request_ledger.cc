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

RequestLedger::Range RequestLedger::Credit(const std::string& key, uint64_t first,
                                           uint64_t served) {
  if (key.empty()) return {std::min(first, served), served, served};
  Entry* entry = Remember(key).first;
  const uint64_t covers = std::min(served, entry->prompt_chunks);
  entry->held.insert(covers);
  const uint64_t from = std::max(entry->credited, std::min(first, covers));
  entry->credited = std::max(entry->credited, covers);
  return {std::min(from, entry->credited), entry->credited, covers};
}

RequestLedger::Range RequestLedger::End(const std::string& key, Range credited, bool served) {
  if (key.empty()) return served ? Range{} : Range{credited.from, credited.to, 0};
  auto it = credited_.find(key);
  if (it == credited_.end()) return {};  // forgotten: nothing to take back
  Entry& e = it->second;
  auto mine = e.held.find(credited.covers);
  if (mine == e.held.end()) return {};  // not a lease of this entry (remembered anew)
  e.held.erase(mine);
  if (served) {
    e.kept = std::max(e.kept, credited.covers);
    return {};
  }
  if (e.credited != credited.to) return {};  // credited after it: no hole is made
  const uint64_t others = std::max(e.kept, e.held.empty() ? 0 : *e.held.rbegin());
  const uint64_t back_from = std::max(credited.from, std::min(others, credited.to));
  e.credited = back_from;
  return {back_from, credited.to, 0};
}

}  // namespace kvtier
