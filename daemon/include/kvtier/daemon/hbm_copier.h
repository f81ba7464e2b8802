// HbmCopier: CacheCore's copies of DRAM chunks into the HBM tier.
//
// Lookups with hbm and Prefetch tickets with to_hbm queue DRAM chunks (Queue);
// the core's I/O workers run Step, which copies up to one batch into HBM with
// the core's mutex dropped. HBM stays a subset of DRAM with no orphans: a chunk
// is copied only after its parent, and DRAM evicting a chunk drops its copy.
//
// Thread-safety: it shares the DRAM tier's mutex with CacheCore (`mu`).
// Methods marked "REQUIRES: mu held" are CacheCore's to call under it; Step
// takes it itself.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kvtier/daemon/core_namespace.h"
#include "kvtier/logging.h"
#include "kvtier/tiers/dram_tier.h"
#include "kvtier/tiers/hbm_tier.h"

namespace kvtier {

class HbmCopier {
 public:
  // What the copier did, for the hbm tier's stats.
  struct Counters {
    uint64_t write_bytes = 0;  // payload bytes copied in
    uint64_t copy_errors = 0;  // copies the GPU refused
  };

  // Everything given must outlive the copier. `work_cv` wakes the core's I/O
  // workers (notified, under mu, when Queue adds work).
  // `take_sequences(n)` (called under mu) hands out n fresh slot sequences
  // and returns the first: each HBM copy gets its own (DESIGN.md, the
  // lapsed-lease check), never its DRAM image's.
  HbmCopier(std::mutex& mu, DramTier& dram, HbmTier& hbm, const CoreNamespaces& namespaces,
            std::condition_variable& work_cv, std::function<uint64_t(size_t)> take_sequences)
      : mu_(mu),
        dram_(dram),
        hbm_(hbm),
        namespaces_(namespaces),
        work_cv_(work_cv),
        take_sequences_(std::move(take_sequences)) {}

  // REQUIRES: mu held. Queues DRAM chunks for a copy (parents before
  // children), skipping those in HBM or queued already.
  void Queue(const std::vector<uint32_t>& dram_handles);
  // REQUIRES: mu held. Whether a copy of `key` is queued or under way.
  bool Queued(const ChunkKey& key) const { return queued_.count(key) > 0; }
  // REQUIRES: mu held. Copies queued (what stats call pending_writes).
  size_t Pending() const { return queue_.size(); }
  // REQUIRES: mu held. How many of `hits` (DRAM handles) have an HBM copy.
  size_t CountIn(const std::vector<uint32_t>& hits) const;
  // REQUIRES: mu held. The sequence in the header of HBM chunk `hbm_handle`.
  uint64_t SequenceOf(uint32_t hbm_handle) const {
    return sequences_.at(hbm_.Get(hbm_handle).slot_offset);
  }
  // REQUIRES: mu held. DRAM is about to evict `handle`: drops its HBM copy.
  void OnDramEviction(uint32_t handle);
  // REQUIRES: mu not held. Copies up to one batch of queued chunks.
  void Step();
  // REQUIRES: mu held.
  const Counters& counters() const { return counters_; }

 private:
  std::mutex& mu_;
  DramTier& dram_;
  HbmTier& hbm_;  // bookkeeping GUARDED_BY(mu_); its copies run without it
  const CoreNamespaces& namespaces_;
  std::condition_variable& work_cv_;
  const std::function<uint64_t(size_t)> take_sequences_;
  std::deque<ChunkKey> queue_;                         // GUARDED_BY(mu_)
  std::unordered_set<ChunkKey, ChunkKeyHash> queued_;  // GUARDED_BY(mu_)
  Counters counters_;                                  // GUARDED_BY(mu_)
  // Each HBM chunk's header sequence, by its slot offset.
  std::unordered_map<uint64_t, uint64_t> sequences_;  // GUARDED_BY(mu_)
  LogLimiter copy_log_;  // a bad GPU repeats its warning at will: one per 10 s
};

}  // namespace kvtier
