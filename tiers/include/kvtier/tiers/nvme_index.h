// NvmeIndex: the NVMe tier's durable index in RocksDB: chunk key -> where its
// slot image lives, with the facts needed to rebuild the in-memory index at
// start (parent key, namespace, slot size, sequence, checksum) and the last
// access time for LRU order.
//
// Records are written only after their slot's data is durable (the caller
// syncs the device first); access times are written in batches, not per hit.
//
// Errors: after the first failed write (a full disk, EIO) the index refuses
// every later write with that error and is closed without a flush: RocksDB 7.8
// aborts the process when a file writer that failed is used again. RocksDB's
// own log goes to kvtierd's (warnings and errors), not to a LOG file on the
// same disk. A start whose probe write fails is refused.
// Keys: 'c' + 16-byte chunk key -> record; 'a' + 16-byte chunk key -> access ms.
//
// Thread-safety: thread-safe (RocksDB is).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "kvtier/chunk_key.h"
#include "kvtier/status.h"

namespace rocksdb {
class DB;
class Env;
class WriteBatch;
}  // namespace rocksdb

namespace kvtier {

struct NvmeRecord {
  ChunkKey key;
  ChunkKey parent;  // the namespace id for chunk 0
  NamespaceId ns;
  uint32_t device = 0;  // index into the tier's --nvme-path list
  uint64_t offset = 0;  // byte offset of the slot image in that file
  uint64_t slot_bytes = 0;
  uint64_t sequence = 0;  // the slot header's sequence
  uint64_t payload_checksum = 0;
  uint64_t last_access_ms = 0;  // unix ms; 0 = never read since written

  friend bool operator==(const NvmeRecord&, const NvmeRecord&) = default;
};

class NvmeIndex {
 public:
  // Opens (creating when missing) the RocksDB database in `dir`. Errors:
  // DATA_LOSS when RocksDB reports corruption (start kvtierd with
  // --rebuild-index), IO_ERROR otherwise, both naming `dir`.
  // `env`: RocksDB's environment (tests wrap the real file system to inject
  // faults); nullptr is the default one. It must outlive the index.
  static Result<std::unique_ptr<NvmeIndex>> Open(const std::string& dir,
                                                 rocksdb::Env* env = nullptr);
  ~NvmeIndex();

  // Disk space the index needs on its file system for an NVMe tier of `nvme_bytes` (all slot
  // files together): its write-ahead log (at most 4 MiB before a flush is
  // forced), a memtable flush (2 MiB) and its manifest, 8 MiB together, plus 1/64 of
  // `nvme_bytes` for its records and their compaction (two copies of ~128 bytes a record,
  // slots of 16 KiB or more). Nothing of it is preallocated; kvtierd checks at start that it
  // is free beside the slot files.
  static uint64_t HeadroomBytes(uint64_t nvme_bytes) {
    return (uint64_t{8} << 20) + nvme_bytes / 64;
  }

  // Adds or replaces records in one synced write batch. Errors: IO_ERROR.
  Status Put(std::span<const NvmeRecord> records);
  // Removes records (and their access times) in one write batch.
  Status Delete(std::span<const ChunkKey> keys);
  // Persists access times (unix ms) in one unsynced batch: losing the last
  // batch in a crash only ages a few chunks.
  Status PutAccessTimes(std::span<const std::pair<ChunkKey, uint64_t>> times);
  // Calls `fn` for every record, with its access time merged in. Errors:
  // DATA_LOSS naming the first malformed value (iteration stops), IO_ERROR.
  Status ForEach(const std::function<void(const NvmeRecord&)>& fn) const;

  // The first failed write (the index refuses writes since); empty while healthy.
  std::string failure() const;

  // A record's RocksDB key and value (without last_access_ms, which has its own key): key
  // 'c' + chunk key; value: version byte 1, parent, namespace, then device (4 bytes),
  // offset, slot_bytes, sequence and payload checksum (8 bytes each), little-endian.
  static std::pair<std::string, std::string> EncodeRecord(const NvmeRecord& record);
  // The inverse, for what ForEach reads (last_access_ms 0). Errors: DATA_LOSS naming the
  // key's and the value's sizes when they are not a record's, or the version is unknown.
  static Result<NvmeRecord> DecodeRecord(std::string_view key, std::string_view value);

 private:
  NvmeIndex(std::unique_ptr<rocksdb::DB> db, std::string dir);
  // One write batch, refused once a write has failed. Errors: IO_ERROR naming `what`.
  Status Write(rocksdb::WriteBatch& batch, bool sync, const char* what);

  std::unique_ptr<rocksdb::DB> db_;
  std::string dir_;
  mutable std::mutex mu_;
  std::string failed_;  // GUARDED_BY(mu_): the first failed write; empty while healthy
};

}  // namespace kvtier
