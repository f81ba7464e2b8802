#include "kvtier/tiers/chunk_index.h"

#include <algorithm>

namespace kvtier {

uint32_t ChunkIndex::Insert(const ChunkEntry& entry) {
  uint32_t handle;
  if (!free_handles_.empty()) {
    handle = free_handles_.back();
    free_handles_.pop_back();
    entries_[handle] = entry;
  } else {
    handle = static_cast<uint32_t>(entries_.size());
    entries_.push_back(entry);
  }
  map_.emplace(entry.key, handle);
  return handle;
}

void ChunkIndex::Erase(uint32_t handle) {
  map_.erase(entries_[handle].key);
  entries_[handle] = ChunkEntry{};
  free_handles_.push_back(handle);
}

std::vector<uint32_t> ChunkIndex::SubtreesDeepestFirst(
    const std::function<bool(uint32_t)>& pick) const {
  // Per handle: its depth here (a chunk whose parent is not here is at 0) and
  // whether it or an ancestor is picked; memoised, so each chunk is walked once.
  struct Mark {
    bool known = false;
    bool in_tree = false;
    uint32_t depth = 0;
  };
  std::vector<Mark> marks(entries_.size());
  std::vector<uint32_t> path;
  std::vector<std::pair<uint32_t, uint32_t>> picked;  // (depth, handle)
  for (const auto& [key, start] : map_) {
    path.clear();
    uint32_t h = start;
    // Up to the first chunk already marked or the top; a chain longer than the
    // index (a cycle, which chained hashes cannot make) stops there.
    while (!marks[h].known && path.size() <= map_.size()) {
      path.push_back(h);
      const uint32_t parent = Find(entries_[h].parent);
      if (parent == kNone) break;
      h = parent;
    }
    for (auto it = path.rbegin(); it != path.rend(); ++it) {
      const uint32_t parent = Find(entries_[*it].parent);
      Mark& m = marks[*it];
      const bool has_parent = parent != kNone && parent != *it && marks[parent].known;
      m.depth = has_parent ? marks[parent].depth + 1 : 0;
      m.in_tree = pick(*it) || (has_parent && marks[parent].in_tree);
      m.known = true;
      if (m.in_tree) picked.emplace_back(m.depth, *it);
    }
  }
  std::sort(picked.begin(), picked.end(), std::greater<>());
  std::vector<uint32_t> out;
  out.reserve(picked.size());
  for (const auto& p : picked) out.push_back(p.second);
  return out;
}

}  // namespace kvtier
