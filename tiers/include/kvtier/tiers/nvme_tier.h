// NvmeTier: the NVMe tier's mechanism: slot images in preallocated O_DIRECT
// files (one BlockDevice per --nvme-path), a slot allocator per device, the
// in-memory index with leaf-first LRU eviction, and the durable RocksDB index
// (NvmeIndex) it is rebuilt from at start.
//
// Durability order: image data is written and fdatasync'ed before its record
// enters RocksDB, so after a crash every record points at a complete image.
// Every read verifies the header (namespace, key, parent, tokens) and the
// payload checksum; a mismatch frees the slot, drops the record, counts a
// corrupt read and returns DATA_LOSS: never served.
//
// kvtierd's CacheCore drives it: Destager writes, Promoter reads (docs/ARCHITECTURE.md).
//
// Thread-safety: thread-safe. mu_ guards the metadata; device I/O runs
// without it (a slot being written is not yet indexed; a slot being read is
// pinned).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvtier/logging.h"
#include "kvtier/slot_image.h"
#include "kvtier/status.h"
#include "kvtier/tiers/block_device.h"
#include "kvtier/tiers/chunk_index.h"
#include "kvtier/tiers/eviction_policy.h"
#include "kvtier/tiers/nvme_index.h"
#include "kvtier/tiers/slot_allocator.h"

namespace kvtier {

struct NvmeTierOptions {
  // Directories, one slot file ("kvtier-slots.dat") each. Default: none.
  std::vector<std::string> paths;
  // Size of each slot file, a multiple of 4096. Default: 8 GiB.
  uint64_t bytes_per_path = uint64_t{8} << 30;
  // io_uring queue depth per I/O thread. Default: 32.
  uint32_t queue_depth = 32;
  // RocksDB directory of the durable index. Default: "" = paths[0]/index.
  std::string index_dir;
  // Which chunk goes when the files are full. Default: leaf-first LRU.
  EvictionPolicyKind eviction = EvictionPolicyKind::kLru;
  // Bytes free for kvtierd on the file system of directory `dir` (statvfs f_bavail x f_frsize).
  // Tests wrap it to report a fuller disk. Default: empty = statvfs.
  std::function<Result<uint64_t>(const std::string& dir)> free_bytes;
};

struct NvmeTierCounters {
  uint64_t chunks = 0;
  uint64_t used_bytes = 0;
  uint64_t capacity_bytes = 0;
  uint64_t evictions = 0;
  uint64_t corrupt_reads = 0;     // images that failed verification (dropped)
  uint64_t dropped_at_start = 0;  // records out of a device, misaligned, overlapping, unrooted
};

// One chunk of the tier, as an admin listing sees it.
struct NvmeChunkInfo {
  ChunkKey key;
  NamespaceId ns;
  uint64_t slot_bytes = 0;  // its slot image (header, payload, padding)
  bool pinned = false;      // a read holds it
};

// One slot image to write: exactly the namespace's slot_bytes, 4 KiB aligned,
// sealed with its payload checksum (SealPayloadChecksum).
struct NvmeImage {
  ChunkKey key;
  ChunkKey parent;
  NamespaceId ns;
  std::span<const std::byte> image;
};

class NvmeTier {
 public:
  // Opens the files and the index (see IoUringFileDevice::Open and
  // NvmeIndex::Open for the start-up errors) and rebuilds the in-memory index.
  // First checks each file system's free bytes (options.free_bytes): INVALID_ARGUMENT naming
  // the directory, the bytes needed and free, when the slot files' bytes not yet allocated
  // plus the index's headroom (NvmeIndex::HeadroomBytes, less what the index holds) do not fit.
  static Result<std::unique_ptr<NvmeTier>> Open(const NvmeTierOptions& options);
  // Rebuilds the durable index by scanning every device's slot headers (for
  // `kvtierd --rebuild-index` when the RocksDB files are missing or corrupt):
  // `index` is expected empty; every image whose header and payload checksum
  // verify is recorded (the newest sequence wins for a key). Returns the
  // number of images recorded. Errors: IO_ERROR.
  static Result<size_t> RebuildIndexFromSlots(std::span<BlockDevice* const> devices,
                                              NvmeIndex& index);
  // The scan behind RebuildIndexFromSlots: the record of every image on `devices` whose
  // header and payload checksum verify, the newest sequence for a key, in no particular
  // order (last_access_ms 0). Errors: IO_ERROR.
  static Result<std::vector<NvmeRecord>> ScanSlots(std::span<BlockDevice* const> devices);
  // Which of `records` (the index's, as read at start, oldest access first) a tier over
  // devices of `device_bytes` keeps; one flag per record. A record is kept when it lies
  // inside its device at a 4 KiB-aligned offset with a 4 KiB-multiple size, overlaps no
  // record kept before it in offset order, and its parents
  // lead to its namespace through kept records (no orphans, no parent cycles). Create drops
  // (and deletes) the others.
  static std::vector<bool> UsableRecords(std::span<const NvmeRecord> records,
                                         std::span<const uint64_t> device_bytes);
  // `kvtierd --rebuild-index`: removes the index directory of `options` and
  // rebuilds it from the slot files. Returns the number of images recorded.
  static Result<size_t> RebuildIndex(const NvmeTierOptions& options);

  // The same over devices built by the caller (tests wrap them to inject faults).
  static Result<std::unique_ptr<NvmeTier>> Create(
      std::vector<std::unique_ptr<BlockDevice>> devices, std::unique_ptr<NvmeIndex> index,
      EvictionPolicyKind eviction = EvictionPolicyKind::kLru);
  ~NvmeTier();

  // Writes `images` durably (data, fdatasync, then the index), evicting
  // leaf-first LRU chunks to make room. An image whose parent is neither its
  // namespace nor resident here, or that is already stored, is skipped.
  // Returns how many were stored. Errors: IO_ERROR (nothing of the failed
  // batch is indexed; slots are freed).
  Result<size_t> Write(std::span<const NvmeImage> images);

  // Reads the image of `id.key` into `buffer` (layout.slot_bytes, 4 KiB
  // aligned) and verifies it. Errors: NOT_FOUND when not stored; DATA_LOSS
  // when it fails verification (then it is dropped); IO_ERROR.
  Status Read(const SlotIdentity& id, const SlotLayout& layout, std::span<std::byte> buffer);

  // One read of ReadMany.
  struct ReadRequest {
    SlotIdentity id;
    const SlotLayout* layout = nullptr;
    std::span<std::byte> buffer;  // layout->slot_bytes, 4 KiB aligned
    Status result;                // set by ReadMany, as Read would return it
  };
  // Reads several images with one batch per device (up to the queue depth in
  // flight), verifying each image as soon as it arrives while the rest are in
  // flight. Each request's `result` says how it went; returns IO_ERROR only
  // when the batch itself failed (then every result is that error).
  Status ReadMany(std::span<ReadRequest> requests);

  // Registers the memory that Write images and ReadMany buffers come from
  // (the DRAM arena) with every device, so their I/O skips per-request page
  // pinning; see BlockDevice::RegisterBuffers for the contract (the regions
  // stay mapped while registered; no I/O runs while registering). Errors:
  // RESOURCE_EXHAUSTED when the kernel refuses (I/O keeps working without).
  Status RegisterBuffers(std::span<const std::span<std::byte>> regions);

  // Admin eviction: removes the chunks `pick(key, ns)` selects and all their
  // descendants here (records first, in one batch), keeping those a read pins
  // and their ancestors. Not counted as evictions. Errors: IO_ERROR when the
  // index refuses the batch (then nothing is removed).
  Result<SubtreeRemoval> RemoveSubtrees(
      const std::function<bool(const ChunkKey& key, const NamespaceId& ns)>& pick);

  // Writes the access times of the chunks read since the last call to the
  // index in one unsynced batch (a crash loses at most that batch's LRU order).
  // The daemon calls it about once a second; the destructor once more. A
  // chunk's write time is its first access time. Errors: IO_ERROR.
  Status PersistAccessTimes();

  // Told of each chunk that becomes resident here (a Write, once its index
  // record is durable; `image` is its slot image, header and token ids first)
  // and of each that leaves (eviction, admin removal, a failed verification;
  // `image` empty), under the tier's lock: it must be quick and must not call
  // the tier. Chunks found at Open are not told. Set it before the tier is
  // used. Default: none.
  using ResidencyListener =
      std::function<void(const ChunkKey& key, const ChunkKey& parent, const NamespaceId& ns,
                         std::span<const std::byte> image)>;
  void SetResidencyListener(ResidencyListener listener) { on_residency_ = std::move(listener); }

  bool Contains(const ChunkKey& key) const;
  // The chunk `key`, or nullopt when it is not here.
  std::optional<NvmeChunkInfo> Info(const ChunkKey& key) const;
  // Calls `f` for each chunk (no order), under the tier's lock, until it returns
  // false. `f` must not call the tier.
  void VisitChunks(const std::function<bool(const NvmeChunkInfo&)>& f) const;
  NvmeTierCounters counters() const;
  // Why the tier takes no more writes (its index failed a write, e.g. on a
  // full disk) until kvtierd restarts; empty while it does. Reads go on.
  std::string write_failure() const { return index_->failure(); }
  // The highest slot sequence any record held at start or any write stored
  // since (0 for an empty tier): the daemon hands out sequences above it, so
  // an image promoted from here never carries one a lease of this run was given.
  uint64_t max_sequence() const;

 private:
  struct Location {
    uint32_t device;
    uint64_t offset;
  };
  NvmeTier(std::vector<std::unique_ptr<BlockDevice>> devices, std::unique_ptr<NvmeIndex> index,
           EvictionPolicyKind eviction);
  Status Rebuild();
  // REQUIRES: mu_ held.
  // A free slot, evicting as needed; nullopt when nothing is evictable.
  // Errors: IO_ERROR when the index refuses to drop a victim's record.
  Result<std::optional<Location>> AllocateLocked(uint64_t slot_bytes);
  // Evicts one chunk (of `same_size` slot bytes unless 0); false when none is evictable.
  // Errors: IO_ERROR when the index refuses to drop its record (it stays).
  Result<bool> EvictOneLocked(uint64_t same_size);
  void EraseLocked(uint32_t handle);
  // Ends one pin of a read or a write's parent.
  void UnpinLocked(uint32_t handle);
  // Indexes a chunk whose slot is already taken in its allocator.
  uint32_t IndexLocked(const ChunkKey& key, const ChunkKey& parent, const NamespaceId& ns,
                       Location loc, uint64_t slot_bytes);

  std::vector<std::unique_ptr<BlockDevice>> devices_;
  std::unique_ptr<NvmeIndex> index_;

  mutable std::mutex mu_;
  std::vector<SlotAllocator> allocators_;   // GUARDED_BY(mu_), one per device
  ChunkIndex chunks_;                       // GUARDED_BY(mu_)
  std::vector<uint64_t> slot_bytes_;        // GUARDED_BY(mu_), per handle
  std::vector<NamespaceId> ns_;             // GUARDED_BY(mu_), per handle
  std::unique_ptr<EvictionPolicy> policy_;  // GUARDED_BY(mu_)
  NvmeTierCounters counters_;               // GUARDED_BY(mu_)
  LogLimiter corrupt_log_;                  // a bad disk can fail every read: one warning per 10 s
  uint64_t max_sequence_ = 0;               // GUARDED_BY(mu_)
  // Chunks read since the last PersistAccessTimes -> unix ms. GUARDED_BY(mu_)
  std::unordered_map<ChunkKey, uint64_t, ChunkKeyHash> dirty_access_;
  ResidencyListener on_residency_;  // set before use; called under mu_
};

}  // namespace kvtier
