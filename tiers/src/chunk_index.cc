#include "kvtier/tiers/chunk_index.h"

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

}  // namespace kvtier
