#include "kvtier/tiers/chunk_index.h"

#include <algorithm>

namespace kvtier {

template <typename Entry>
uint32_t BasicChunkIndex<Entry>::Insert(const Entry& entry) {
  if ((size_ + 1) * 4 > table_.size() * 3) Rehash(std::max<size_t>(16, table_.size() * 2));
  uint32_t handle;
  if (!free_handles_.empty()) {
    handle = free_handles_.back();
    free_handles_.pop_back();
    entries_[handle] = entry;
  } else {
    handle = static_cast<uint32_t>(entries_.size());
    entries_.push_back(entry);
  }
  size_t i = Home(entry.key);
  while (table_[i] != kNone) i = (i + 1) & mask_;
  table_[i] = handle;
  ++size_;
  return handle;
}

template <typename Entry>
void BasicChunkIndex<Entry>::Erase(uint32_t handle) {
  size_t i = Home(entries_[handle].key);
  while (table_[i] != handle) i = (i + 1) & mask_;
  // Backward shift: move up each later handle of the run that may sit at i
  // (its home is not cyclically within (i, j]), so no probe meets a hole.
  for (size_t j = (i + 1) & mask_; table_[j] != kNone; j = (j + 1) & mask_) {
    const size_t home = Home(entries_[table_[j]].key);
    if (((j - home) & mask_) >= ((j - i) & mask_)) {
      table_[i] = table_[j];
      i = j;
    }
  }
  table_[i] = kNone;
  --size_;
  entries_[handle] = Entry{};
  free_handles_.push_back(handle);
}

template <typename Entry>
void BasicChunkIndex<Entry>::Reserve(size_t num_chunks) {
  size_t capacity = 16;
  while (capacity * 3 < num_chunks * 4) capacity *= 2;
  if (capacity > table_.size()) Rehash(capacity);
}

template <typename Entry>
void BasicChunkIndex<Entry>::Rehash(size_t capacity) {
  std::vector<uint32_t> old = std::move(table_);
  table_.assign(capacity, kNone);
  mask_ = capacity - 1;
  for (const uint32_t h : old) {
    if (h == kNone) continue;
    size_t i = Home(entries_[h].key);
    while (table_[i] != kNone) i = (i + 1) & mask_;
    table_[i] = h;
  }
}

template <typename Entry>
std::vector<uint32_t> BasicChunkIndex<Entry>::SubtreesDeepestFirst(
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
  for (const uint32_t start : table_) {
    if (start == kNone) continue;
    path.clear();
    uint32_t h = start;
    // Up to the first chunk already marked or the top; a chain longer than the
    // index (a cycle, which chained hashes cannot make) stops there.
    while (!marks[h].known && path.size() <= size_) {
      path.push_back(h);
      const uint32_t parent = ParentOf(h);
      if (parent == kNone) break;
      h = parent;
    }
    for (auto it = path.rbegin(); it != path.rend(); ++it) {
      const uint32_t parent = ParentOf(*it);
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

template class BasicChunkIndex<ChunkEntry>;
template class BasicChunkIndex<SlotEntry>;

}  // namespace kvtier
