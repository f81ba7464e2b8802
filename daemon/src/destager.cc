#include "kvtier/daemon/destager.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "kvtier/tiers/write_pipeline.h"

namespace kvtier {

Result<NvmeWritePolicy> ParseNvmeWritePolicy(const std::string& name) {
  if (name == "write_through") return NvmeWritePolicy::kWriteThrough;
  if (name == "selective") return NvmeWritePolicy::kSelective;
  if (name == "write_back") return NvmeWritePolicy::kWriteBack;
  return Status::InvalidArgument("nvme_write_policy '" + name +
                                 "' is unknown (write_through, write_back, selective)");
}

Destager::Destager(const Options& options, std::mutex& mu, DramTier& dram, NvmeTier& nvme,
                   NvmeHealth& health, const CoreNamespaces& namespaces, RemoteTier* remote)
    : options_(options),
      mu_(mu),
      dram_(dram),
      nvme_(nvme),
      health_(health),
      remote_(remote),
      namespaces_(namespaces) {}

void Destager::Queue(uint32_t handle, bool to_remote) {
  const SlotEntry& e = dram_.Get(handle);
  dram_.HoldForWrite(handle);  // evicted before its write only when nothing else can be
  const uint64_t slot_bytes = namespaces_[e.ns_index]->layout.slot_bytes;
  queue_.push_back({e.key, SlotSequence(dram_.SlotAddress(e.slot_offset)), slot_bytes, to_remote});
  queue_bytes_ += slot_bytes;
}

bool Destager::WaitForRoom(std::unique_lock<std::mutex>& lock, uint64_t incoming) {
  // The queue and this store together stay within half the arena; a store
  // larger than that alone waits for an empty queue.
  const uint64_t bound = dram_.capacity_bytes() / 2;
  const auto room = [&] { return queue_bytes_ == 0 || queue_bytes_ + incoming <= bound; };
  if (room()) return true;
  // Real time, not the core's clock: the writer runs in real time whatever a test clock says.
  progress_cv_.wait_for(lock, options_.write_through_wait, [&] { return room() || stopping_; });
  return room();
}

void Destager::Stop() {
  stopping_ = true;
  progress_cv_.notify_all();
}

void Destager::Demote(uint32_t handle, bool count_skips) {
  // The victim and its ancestors not on NVMe yet: leaf-first eviction takes
  // children first, and NVMe refuses a chunk whose parent it does not hold.
  std::vector<uint32_t> chain;
  for (uint32_t h = handle; h != ChunkIndex::kNone;) {
    const SlotEntry& e = dram_.Get(h);
    if (nvme_.Contains(e.key) || demoting_.count(e.key) > 0) break;
    chain.push_back(h);
    h = e.parent;  // kNoParent (kNone) past the first chunk: its parent is the namespace
  }
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {  // parents first
    const SlotEntry& e = dram_.Get(*it);
    const CoreNamespace& ns = *namespaces_[e.ns_index];
    if (demotion_bytes_ + ns.layout.slot_bytes > options_.write_back_buffer_bytes) {
      // The victim is lost to NVMe; its ancestors stay in DRAM for a later try.
      if (count_skips) ++counters_.skipped_writes;
      return;
    }
    Demotion d{e.key,
               dram_.ParentKey(*it),
               ns.id,
               ns.layout,
               {static_cast<std::byte*>(std::aligned_alloc(kBlockBytes, ns.layout.slot_bytes)),
                &std::free}};
    std::memcpy(d.image.get(), dram_.SlotAddress(e.slot_offset), ns.layout.slot_bytes);
    demotion_bytes_ += ns.layout.slot_bytes;
    demoting_.insert(e.key);
    demotions_.push_back(std::move(d));
  }
}

size_t Destager::DramOnly() const {
  if (options_.policy != NvmeWritePolicy::kWriteBack) return 0;
  std::lock_guard lock(mu_);
  size_t n = 0;  // those queued for the writer are Pending's, not counted twice
  dram_.ForEachChunk([&](uint32_t h) {
    const ChunkKey& key = dram_.Get(h).key;
    n += !nvme_.Contains(key) && demoting_.count(key) == 0;
  });
  return n;
}

size_t Destager::FlushWriteBack(const std::function<bool()>& keep_going) {
  if (options_.policy != NvmeWritePolicy::kWriteBack) return 0;
  std::vector<ChunkKey> keys;
  {
    std::lock_guard lock(mu_);
    dram_.ForEachChunk([&](uint32_t h) {
      if (!nvme_.Contains(dram_.Get(h).key)) keys.push_back(dram_.Get(h).key);
    });
  }
  const auto degraded = [&] {
    std::lock_guard lock(mu_);
    return health_.Degraded();
  };
  size_t next = 0, queued = 0;
  while (next < keys.size() && !degraded() && keep_going()) {
    {
      std::lock_guard lock(mu_);
      while (next < keys.size() && demotion_bytes_ < options_.write_back_buffer_bytes &&
             (next % 64 != 0 || keep_going())) {  // copying 256 MiB takes a while: check often
        const uint32_t h = dram_.Find(keys[next++]);
        if (h == ChunkIndex::kNone) continue;
        Demote(h, /*count_skips=*/false);
        if (demoting_.count(dram_.Get(h).key) == 0 && !nvme_.Contains(dram_.Get(h).key)) {
          if (demotion_bytes_ == 0) continue;  // larger than the whole buffer: left out
          --next;  // the buffer filled on its ancestors: again after the writes
          break;
        }
        ++queued;
      }
    }
    while (keep_going() && WriteOnce() > 0) {
    }
  }
  return queued;
}

size_t Destager::WriteDemotions() {
  std::vector<Demotion> demoted;
  {
    std::lock_guard lock(mu_);
    if (evictions_waiting_ > 0) return 0;  // an admin eviction waits for the writes in flight
    while (!demotions_.empty() && demoted.size() < kBatchChunks) {
      demoted.push_back(std::move(demotions_.front()));
      demotions_.pop_front();
    }
    in_flight_ += demoted.size();
  }
  if (demoted.empty()) return 0;
  std::vector<NvmeImage> images;
  for (Demotion& d : demoted) {
    SealPayloadChecksum(d.image.get(), d.layout);
    images.push_back({d.key, d.parent, d.ns, {d.image.get(), d.layout.slot_bytes}});
  }
  const Result<size_t> stored =
      WriteTiers(images, remote_ != nullptr ? std::span<const NvmeImage>(images)
                                            : std::span<const NvmeImage>());
  std::lock_guard lock(mu_);
  health_.NoteWrite(stored.status(), "write-back", images.size());
  EndWrites(demoted.size());
  for (const Demotion& d : demoted) {
    demoting_.erase(d.key);
    demotion_bytes_ -= d.layout.slot_bytes;
    CountWritten(d.key, d.layout);
  }
  return demoted.size();
}

std::optional<Destager::ThroughBatch> Destager::TakeAndCopy(StagingBuffer& staging) {
  const uint64_t max_batch_bytes = std::min<uint64_t>(kBatchBytes, dram_.capacity_bytes() / 16);
  struct Item {
    uint32_t handle;
    ChunkKey key, parent;
    NamespaceId ns;
    SlotLayout layout;
    const std::byte* slot;
    bool to_remote;
  };
  std::vector<Item> items;
  try {
    items.reserve(kBatchChunks);  // before any pin: nothing below throws while chunks are pinned
  } catch (const std::bad_alloc&) {
    return std::nullopt;  // nothing taken: the queue waits for memory
  }
  ThroughBatch batch;
  {
    std::lock_guard lock(mu_);
    if (evictions_waiting_ > 0) return std::nullopt;
    uint64_t batch_bytes = 0;  // the copies below: max_batch_bytes and one slot at most
    while (!queue_.empty() && batch.taken < kBatchChunks && batch_bytes < max_batch_bytes) {
      const PendingWrite w = queue_.front();
      queue_.pop_front();
      queue_bytes_ -= w.slot_bytes;
      ++batch.taken;
      const uint32_t h = dram_.Find(w.key);
      if (h == ChunkIndex::kNone ||
          SlotSequence(dram_.SlotAddress(dram_.Get(h).slot_offset)) != w.sequence) {
        ++counters_.skipped_writes;  // evicted before its turn: NVMe lagged
        continue;
      }
      dram_.ReleaseWriteHold(h);
      dram_.Pin(h);  // while it is copied
      // On NVMe already, or in a batch taken before and not yet written (evicted and stored
      // again meanwhile, or queued twice): that batch writes it.
      if (nvme_.Contains(w.key) || !writing_.insert(w.key).second) {
        dram_.Unpin(h);
        continue;
      }
      const SlotEntry& e = dram_.Get(h);
      const CoreNamespace& ns = *namespaces_[e.ns_index];
      items.push_back({h, w.key, dram_.ParentKey(h), ns.id, ns.layout,
                       dram_.SlotAddress(e.slot_offset), w.to_remote});
      batch_bytes += ns.layout.slot_bytes;
    }
    in_flight_ += items.size();
  }
  if (batch.taken == 0) return std::nullopt;
  uint64_t staging_bytes = 0;
  for (const Item& it : items) staging_bytes += it.layout.slot_bytes;
  std::byte* copy = nullptr;
  try {
    copy = staging.Reserve(staging_bytes);  // grows it the first time, or for larger slots
    batch.images.reserve(items.size());
    batch.layouts.reserve(items.size());
    if (remote_ != nullptr) batch.remote_images.reserve(items.size());
  } catch (const std::bad_alloc&) {  // the chunks stay in DRAM, not written: lost writes
    spdlog::warn("NVMe writer: no memory for a {}-byte staging buffer: {} chunks not written",
                 staging_bytes, items.size());
    {
      std::lock_guard lock(mu_);
      for (const Item& it : items) {
        dram_.Unpin(it.handle);
        writing_.erase(it.key);
      }
      counters_.lost_writes += items.size();
      EndWrites(items.size());
    }
    progress_cv_.notify_all();
    batch.images.clear();
    batch.layouts.clear();
    batch.remote_images.clear();
    return batch;
  }
  for (const Item& it : items) {
    std::memcpy(copy, it.slot, it.layout.slot_bytes);
    SealPayloadChecksum(copy, it.layout);
    batch.images.push_back({it.key, it.parent, it.ns, {copy, it.layout.slot_bytes}});
    batch.layouts.push_back(it.layout);
    if (remote_ != nullptr && it.to_remote) batch.remote_images.push_back(batch.images.back());
    copy += it.layout.slot_bytes;  // slot sizes are multiples of 4096: each copy stays aligned
  }
  {  // Copied: DRAM may evict them now; the copies go to NVMe.
    std::lock_guard lock(mu_);
    for (const Item& it : items) dram_.Unpin(it.handle);
  }
  progress_cv_.notify_all();  // stores waiting for room under the bound
  return batch;
}

Result<size_t> Destager::WriteTiers(std::span<const NvmeImage> images,
                                    std::span<const NvmeImage> remote) {
  const auto write_remote = [&] {
    try {
      remote_->WriteMany(remote);
    } catch (const std::exception& e) {  // std::bad_alloc: the images are not stored there
      spdlog::warn("remote tier: a batch of {} images not written: {}", remote.size(), e.what());
    }
  };
  std::thread remote_write;
  if (!remote.empty()) {
    try {
      remote_write = std::thread(write_remote);
    } catch (const std::system_error&) {  // no thread to be had: after NVMe's, as before
    }
  }
  Result<size_t> stored = size_t{0};
  try {
    if (!images.empty()) {
      LatencyTimer timer(write_latency_);
      stored = nvme_.Write(images);
    }
  } catch (const std::exception& e) {  // std::bad_alloc from RocksDB: the batch is lost
    stored = Status::IOError(std::string("NVMe write: ") + e.what());
  }
  if (remote_write.joinable()) {
    remote_write.join();
  } else if (!remote.empty()) {
    write_remote();
  }
  return stored;
}

void Destager::WriteBatch(const ThroughBatch& batch) {
  const Result<size_t> stored = WriteTiers(batch.images, batch.remote_images);
  std::lock_guard lock(mu_);
  if (!batch.images.empty())
    health_.NoteWrite(stored.status(), "write-through", batch.images.size());
  EndWrites(batch.images.size());
  for (size_t i = 0; i < batch.images.size(); ++i) {
    CountWritten(batch.images[i].key, batch.layouts[i]);
    writing_.erase(batch.images[i].key);
  }
}

size_t Destager::WriteOnce() { return WriteBatches(1); }

size_t Destager::WriteBatches(size_t max_batches, const std::function<bool()>& keep_going) {
  // Write-back: the images were copied out at eviction.
  if (const size_t demoted = WriteDemotions(); demoted > 0) return demoted;
  std::lock_guard staging_lock(staging_mu_);  // before mu_, never inside it
  size_t taken = 0;
  WritePipelined<ThroughBatch>(
      staging_, max_batches,
      [&](StagingBuffer& staging) -> std::optional<ThroughBatch> {
        if (keep_going && !keep_going()) return std::nullopt;
        std::optional<ThroughBatch> b = TakeAndCopy(staging);
        if (b) taken += b->taken;
        return b;
      },
      [&](const ThroughBatch& b) { WriteBatch(b); });
  return taken;
}

void Destager::CountWritten(const ChunkKey& key, const SlotLayout& layout) {
  // By where the chunk is now, not by how many Write stored: it skips some
  // (parent gone, no room) and a failed batch stores none.
  if (nvme_.Contains(key)) {
    counters_.write_bytes += layout.payload_bytes;
  } else {
    ++counters_.lost_writes;
  }
}

void Destager::EndWrites(size_t n) {
  in_flight_ -= n;
  if (in_flight_ == 0) idle_cv_.notify_all();
}

void Destager::DrainForEviction(std::unique_lock<std::mutex>& lock) {
  ++evictions_waiting_;
  idle_cv_.wait(lock, [&] { return in_flight_ == 0; });
  --evictions_waiting_;
}

void Destager::DropQueued(const std::unordered_set<ChunkKey, ChunkKeyHash>& removed,
                          const std::optional<NamespaceId>& ns) {
  std::erase_if(queue_, [&](const PendingWrite& w) {
    if (removed.count(w.key) == 0) return false;
    queue_bytes_ -= w.slot_bytes;
    return true;
  });
  // Images copied out at eviction (write-back) carry no subtree: drop the
  // scope's namespace (all of a prefix's namespace; losing them costs misses only).
  std::erase_if(demotions_, [&](const Demotion& d) {
    if (ns && d.ns != *ns) return false;
    demoting_.erase(d.key);
    demotion_bytes_ -= d.layout.slot_bytes;
    return true;
  });
}

}  // namespace kvtier
