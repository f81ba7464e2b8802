// The NVMe tier's storage in memory, for fuzz targets that run thousands of inputs a second:
// MemoryBlockDevice (a BlockDevice over host memory that outlives the device, so a "restart"
// reopens the same bytes) and MemoryIndexDir (an NvmeIndex directory in RocksDB's in-memory
// environment, destroyed between inputs). The tier code above them (NvmeTier, NvmeIndex,
// CacheCore) is the real one. Fuzz targets only; never linked into production targets.
#pragma once

#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/options.h>
#include <unistd.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include "kvtier/tiers/block_device.h"
#include "kvtier/tiers/nvme_index.h"

namespace kvtier::fuzz {

// kBlockBytes-aligned bytes, zeroed at first: one device's, or an image or read buffer.
class MemoryDisk {
 public:
  explicit MemoryDisk(uint64_t bytes)
      : bytes_(bytes), data_(static_cast<std::byte*>(std::aligned_alloc(kBlockBytes, bytes))) {
    std::memset(data_.get(), 0, bytes);
  }
  std::byte* data() { return data_.get(); }
  uint64_t bytes() const { return bytes_; }

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  uint64_t bytes_;
  std::unique_ptr<std::byte, Free> data_;
};

// A BlockDevice over a MemoryDisk. Writes fail with EIO while `fail_writes` is set, reads
// while `fail_reads` is set (a failing disk, as FaultInjectionDevice does for real files).
// Thread-safety: as BlockDevice (requests of one batch touch disjoint ranges).
class MemoryBlockDevice final : public BlockDevice {
 public:
  explicit MemoryBlockDevice(std::shared_ptr<MemoryDisk> disk)
      : BlockDevice(disk->bytes()), disk_(std::move(disk)) {}

  bool fail_writes = false;
  bool fail_reads = false;

 protected:
  Status SubmitImpl(std::span<const IoRequest> batch) override {
    for (const IoRequest& r : batch) {
      if (r.op == IoRequest::Op::kWrite) {
        if (fail_writes) return Status::FromErrno(EIO, "memory device: injected write fault");
        std::memcpy(disk_->data() + r.offset, r.buffer.data(), r.buffer.size());
      } else {
        if (fail_reads) return Status::FromErrno(EIO, "memory device: injected read fault");
        std::memcpy(r.buffer.data(), disk_->data() + r.offset, r.buffer.size());
      }
    }
    return Status::Ok();
  }
  Status SyncImpl() override { return Status::Ok(); }

 private:
  std::shared_ptr<MemoryDisk> disk_;
};

// RocksDB's in-memory environment, one per process.
inline rocksdb::Env* MemoryEnv() {
  static rocksdb::Env* const env = rocksdb::NewMemEnv(rocksdb::Env::Default());
  return env;
}

// Whether an input that asks for a path through RocksDB (slow: tens of ms an input, mostly
// opening the database) gets it: at most one execution in 32 does, however much the corpus
// favours such inputs (they reach more code); the first always does, so that a saved crash
// input reproduces when run alone.
inline bool RocksDbPathNow(bool asked) {
  static uint32_t since_last = 31;
  const bool now = asked && since_last >= 31;
  since_last = now ? 0 : since_last + 1;
  return now;
}

// One index directory in MemoryEnv(), empty when made and destroyed with this object.
// NvmeIndex::Open also makes the directory on the real file system (empty; one per process,
// removed at exit).
class MemoryIndexDir {
 public:
  MemoryIndexDir() : path_(Path()) {}
  ~MemoryIndexDir() {
    rocksdb::Options o;
    o.env = MemoryEnv();
    (void)rocksdb::DestroyDB(path_, o);
  }
  MemoryIndexDir(const MemoryIndexDir&) = delete;
  MemoryIndexDir& operator=(const MemoryIndexDir&) = delete;

  const std::string& path() const { return path_; }
  Result<std::unique_ptr<NvmeIndex>> Open() const { return NvmeIndex::Open(path_, MemoryEnv()); }

 private:
  static std::string Path() {
    static const std::string path = [] {
      const auto p = std::filesystem::temp_directory_path() /
                     ("kvtier-fuzz-index-" + std::to_string(getpid()));
      std::atexit([] {
        std::error_code ec;
        std::filesystem::remove_all(std::filesystem::temp_directory_path() /
                                        ("kvtier-fuzz-index-" + std::to_string(getpid())),
                                    ec);
      });
      return p.string();
    }();
    return path;
  }
  std::string path_;
};

}  // namespace kvtier::fuzz
