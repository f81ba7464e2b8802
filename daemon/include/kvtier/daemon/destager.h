// Destager: CacheCore's way down from DRAM (destaging): to the NVMe tier and, with one, the
// remote tier (kvtierd's logs call it the NVMe writer).
//
// Write-through and selective queue resident DRAM chunks (Queue); each keeps a
// write hold in DRAM (evicted before its write only when nothing else can be)
// until WriteOnce copies a batch of them into a staging buffer, seals their
// checksums and writes them (WriteBatches: several, each batch's write beside
// the next one's copy). Write-back copies each DRAM victim's image out at
// eviction (Demote), with its ancestors not yet on NVMe, and WriteOnce writes
// those images instead. The daemon's NVMe worker calls WriteBatches in a loop.
// With a remote tier, each batch of sealed images is also written there, beside
// the NVMe write (the same write policy; a failure there does not touch
// NVMe's), but for the chunks promoted from it, which write-through queues for
// NVMe alone.
//
// Thread-safety: it shares the DRAM tier's mutex with CacheCore (`mu`).
// Methods marked "REQUIRES: mu held" are CacheCore's to call under it; the
// others take it themselves and never hold it across a write. Write-back's
// image copies (Demote, and FlushWriteBack's) run under it; write-through's
// batch copy does not.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include "kvtier/daemon/core_namespace.h"
#include "kvtier/daemon/nvme_health.h"
#include "kvtier/latency_histogram.h"
#include "kvtier/status.h"
#include "kvtier/tiers/dram_tier.h"
#include "kvtier/tiers/nvme_tier.h"
#include "kvtier/tiers/remote_tier.h"
#include "kvtier/tiers/staging_buffer.h"

namespace kvtier {

// When a committed DRAM chunk goes to NVMe.
enum class NvmeWritePolicy {
  kWriteThrough,  // every committed chunk, in the background
  kSelective,     // once it has been hit selective_min_hits times
  kWriteBack,     // when DRAM evicts it (with its ancestors not yet on NVMe)
};

// "write_through", "write_back" or "selective"; INVALID_ARGUMENT otherwise.
Result<NvmeWritePolicy> ParseNvmeWritePolicy(const std::string& name);

class Destager {
 public:
  struct Options {
    NvmeWritePolicy policy = NvmeWritePolicy::kWriteThrough;
    // Write-back: most bytes of evicted images held until written; past it an
    // eviction is a skipped write.
    uint64_t write_back_buffer_bytes = 0;
    // Write-through: how long a store waits for room (WaitForRoom).
    std::chrono::milliseconds write_through_wait{0};
  };
  // What the writer did, for the nvme tier's stats.
  struct Counters {
    uint64_t write_bytes = 0;     // payload bytes now on NVMe
    uint64_t skipped_writes = 0;  // chunks DRAM evicted before their write
    uint64_t lost_writes = 0;     // chunks a write took but NVMe does not hold
  };
  // A batch: up to kBatchChunks chunks, and while under kBatchBytes and 1/16
  // of the DRAM arena (so one slot more at most).
  static constexpr size_t kBatchChunks = 256;
  static constexpr uint64_t kBatchBytes = uint64_t{64} << 20;

  // Everything given must outlive the writer; `namespaces` is read under `mu`.
  // `remote`: null without a remote tier.
  Destager(const Options& options, std::mutex& mu, DramTier& dram, NvmeTier& nvme,
           NvmeHealth& health, const CoreNamespaces& namespaces, RemoteTier* remote);

  // REQUIRES: mu held. Queues resident chunk `handle` (write-through,
  // selective); `to_remote`: to the remote tier as well (not for a chunk read
  // from there).
  void Queue(uint32_t handle, bool to_remote = true);
  // REQUIRES: mu held by `lock`. Write-through backpressure: waits, with mu
  // dropped, up to write_through_wait while the queued writes and `incoming`
  // (the slot bytes a store may add) fill over half the arena (a store bigger
  // than that: while anything is queued); false when they still do at the end.
  bool WaitForRoom(std::unique_lock<std::mutex>& lock, uint64_t incoming);
  // REQUIRES: mu held. Write-back's eviction listener: copies the victim's
  // image, and those of its ancestors not on NVMe, parents first. Past
  // write_back_buffer_bytes it stops; `count_skips`: count the victim as a
  // skipped write (an eviction loses it).
  void Demote(uint32_t handle, bool count_skips);
  // Writes up to one batch and returns how many chunks it took from the queue.
  size_t WriteOnce();
  // Writes up to `max_batches` batches, each write-through batch's write
  // overlapping the next one's copy and checksums (WritePipelined); returns
  // how many chunks it took. Write-back: one batch of images, as WriteOnce.
  // Everything it took is written (or counted lost) when it returns. When
  // `keep_going` (if given) says no before a batch is taken, it stops there:
  // at most the batch being written and one more are written after it.
  size_t WriteBatches(size_t max_batches, const std::function<bool()>& keep_going = {});
  // Write-back at a clean shutdown: demotes and writes every DRAM chunk not on
  // NVMe (stops early when the tier is degraded or `keep_going` says no,
  // checked between batches). Returns how many it queued.
  size_t FlushWriteBack(const std::function<bool()>& keep_going);
  // REQUIRES: mu held. Writes queued or in flight.
  size_t Pending() const { return queue_.size() + demotions_.size() + in_flight_; }
  // Under write-back: DRAM chunks neither on NVMe nor queued for it; 0 under
  // the other policies. Takes mu.
  size_t DramOnly() const;
  // REQUIRES: mu held. Counters so far.
  const Counters& counters() const { return counters_; }
  // Each batch written to NVMe (write-through or write-back), any thread.
  const LatencyHistogram& write_latency() const { return write_latency_; }
  // REQUIRES: mu held by `lock`. Takes no new batch, and waits for those in
  // flight, so that an admin eviction is not undone by a write landing.
  void DrainForEviction(std::unique_lock<std::mutex>& lock);
  // REQUIRES: mu held. Drops queued writes of `removed` chunks and images of
  // namespace `ns` (every namespace when nullopt) after an admin eviction.
  void DropQueued(const std::unordered_set<ChunkKey, ChunkKeyHash>& removed,
                  const std::optional<NamespaceId>& ns);
  // REQUIRES: mu held. Ends WaitForRoom's waits: the core is stopping.
  void Stop();

 private:
  struct PendingWrite {
    ChunkKey key;
    uint64_t sequence = 0;  // the slot's sequence when queued: the same chunk, not a re-store
    uint64_t slot_bytes = 0;
    bool to_remote = true;
  };
  struct Demotion {
    ChunkKey key, parent;
    NamespaceId ns;
    SlotLayout layout;
    std::unique_ptr<std::byte, void (*)(void*)> image{nullptr, nullptr};
  };
  // A write-through batch copied out of DRAM into a staging buffer.
  struct ThroughBatch {
    size_t taken = 0;                      // queue entries it took (skipped ones too)
    std::vector<NvmeImage> images;         // into the staging buffer
    std::vector<SlotLayout> layouts;       // of each image
    std::vector<NvmeImage> remote_images;  // those the remote tier gets too
  };
  size_t WriteDemotions();
  // Takes up to one batch from the queue and copies and seals it into
  // `staging` (without mu held; mu is taken around it); nullopt when the queue
  // is empty or an admin eviction waits.
  std::optional<ThroughBatch> TakeAndCopy(StagingBuffer& staging);
  // Writes a batch TakeAndCopy made and counts it (takes mu after the write).
  void WriteBatch(const ThroughBatch& batch);
  // Writes `images` to NVMe and, at the same time on a thread of its own,
  // `remote` to the remote tier; returns NVMe's result once both are done.
  Result<size_t> WriteTiers(std::span<const NvmeImage> images, std::span<const NvmeImage> remote);
  // REQUIRES: mu held. Counts a chunk a write batch took: written or lost.
  void CountWritten(const ChunkKey& key, const SlotLayout& layout);
  // REQUIRES: mu held. Ends `n` writes in flight.
  void EndWrites(size_t n);

  const Options options_;
  std::mutex& mu_;
  DramTier& dram_;
  NvmeTier& nvme_;  // thread-safe itself; lock order: mu_, then its own
  NvmeHealth& health_;
  RemoteTier* const remote_;  // thread-safe itself; called without mu_
  const CoreNamespaces& namespaces_;

  std::deque<PendingWrite> queue_;  // GUARDED_BY(mu_)
  uint64_t queue_bytes_ = 0;        // slot bytes of queue_       GUARDED_BY(mu_)
  std::deque<Demotion> demotions_;  // GUARDED_BY(mu_)
  std::unordered_set<ChunkKey, ChunkKeyHash> demoting_;  // GUARDED_BY(mu_)
  uint64_t demotion_bytes_ = 0;                          // GUARDED_BY(mu_)
  uint64_t in_flight_ = 0;                               // GUARDED_BY(mu_)
  // Keys of the write-through batches taken and not yet written (at most two).
  std::unordered_set<ChunkKey, ChunkKeyHash> writing_;  // GUARDED_BY(mu_)
  uint32_t evictions_waiting_ = 0;                      // GUARDED_BY(mu_)
  bool stopping_ = false;                               // GUARDED_BY(mu_)
  Counters counters_;                                   // GUARDED_BY(mu_)
  LatencyHistogram write_latency_;
  std::condition_variable progress_cv_;  // a batch was taken (WaitForRoom)
  std::condition_variable idle_cv_;      // in_flight_ reached 0 (DrainForEviction)
  // Write-through's copies of two batches (one written while the next is
  // copied), kept from one batch to the next (each up to 64 MiB or 1/16 of the
  // arena, and one slot). Taken before mu_, never inside it.
  std::mutex staging_mu_;
  StagingBuffer staging_[2];  // GUARDED_BY(staging_mu_)
};

}  // namespace kvtier
