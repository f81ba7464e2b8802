#include "kvtier/tiers/nvme_index.h"

#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/write_batch.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <unordered_map>

namespace kvtier {
namespace {

constexpr char kRecordPrefix = 'c';
constexpr char kAccessPrefix = 'a';
constexpr uint8_t kRecordVersion = 1;
// version(1) + parent(16) + ns(16) + device(4) + offset, slot_bytes, sequence, checksum (4 x 8)
constexpr size_t kRecordBytes = 1 + 16 + 16 + 4 + 8 * 4;

std::string DbKey(char prefix, const ChunkKey& key) {
  std::string k(1 + ChunkKey::kBytes, prefix);
  key.ToBytes(reinterpret_cast<std::byte*>(k.data() + 1));
  return k;
}

template <typename T>
void Put(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

template <typename T>
T Get(const char*& p) {
  T v;
  std::memcpy(&v, p, sizeof(v));
  p += sizeof(v);
  return v;
}

Status ToStatus(const rocksdb::Status& s, const std::string& what) {
  if (s.ok()) return Status::Ok();
  if (s.IsCorruption()) {
    return Status::DataLoss(what + ": " + s.ToString() + " (start kvtierd with --rebuild-index)");
  }
  return Status::IOError(what + ": " + s.ToString());
}

// RocksDB's log lines at WARN and above, into kvtierd's log.
class SpdlogRocksLogger : public rocksdb::Logger {
 public:
  explicit SpdlogRocksLogger(std::string dir)
      : rocksdb::Logger(rocksdb::InfoLogLevel::WARN_LEVEL), dir_(std::move(dir)) {}
  using rocksdb::Logger::Logv;
  void Logv(const char* format, va_list ap) override {
    Logv(rocksdb::InfoLogLevel::INFO_LEVEL, format, ap);
  }
  void Logv(const rocksdb::InfoLogLevel level, const char* format, va_list ap) override {
    if (level < GetInfoLogLevel()) return;
    char line[1024];
    std::vsnprintf(line, sizeof(line), format, ap);
    for (size_t n = std::strlen(line); n > 0 && (line[n - 1] == '\n' || line[n - 1] == ' '); --n) {
      line[n - 1] = '\0';
    }
    {  // RocksDB repeats some lines every few seconds (a full disk): once a minute
      std::lock_guard lock(mu_);
      const auto now = std::chrono::steady_clock::now();
      auto [it, fresh] = seen_.try_emplace(line, now);
      if (!fresh && now - it->second < std::chrono::minutes(1)) return;
      it->second = now;
      if (seen_.size() > 256) seen_.clear();
    }
    if (level >= rocksdb::InfoLogLevel::ERROR_LEVEL) {
      spdlog::error("RocksDB (NVMe index {}): {}", dir_, line);
    } else {
      spdlog::warn("RocksDB (NVMe index {}): {}", dir_, line);
    }
  }

 private:
  std::string dir_;
  std::mutex mu_;
  // Each line's last time in the log. GUARDED_BY(mu_)
  std::unordered_map<std::string, std::chrono::steady_clock::time_point> seen_;
};

constexpr char kProbeKey[] = "probe";
constexpr char kFreeSpaceHint[] =
    ": if its disk is full, free space there or start with --nvme-bytes 0";  // sorts after the 'a'
                                                                             // and 'c' prefixes
                                                                             // ForEach reads

}  // namespace

std::pair<std::string, std::string> NvmeIndex::EncodeRecord(const NvmeRecord& r) {
  std::string v;
  v.reserve(kRecordBytes);
  v.push_back(static_cast<char>(kRecordVersion));
  v += r.parent.ToBytes();
  v += r.ns.ToBytes();
  kvtier::Put(v, r.device);
  kvtier::Put(v, r.offset);
  kvtier::Put(v, r.slot_bytes);
  kvtier::Put(v, r.sequence);
  kvtier::Put(v, r.payload_checksum);
  return {DbKey(kRecordPrefix, r.key), std::move(v)};
}

Result<NvmeRecord> NvmeIndex::DecodeRecord(std::string_view k, std::string_view v) {
  if (k.size() != 1 + ChunkKey::kBytes || k[0] != kRecordPrefix || v.size() != kRecordBytes ||
      static_cast<uint8_t>(v[0]) != kRecordVersion) {
    return Status::DataLoss("malformed record (key " + std::to_string(k.size()) + " bytes, value " +
                            std::to_string(v.size()) + " bytes)");
  }
  NvmeRecord r;
  r.key = ChunkKey::FromBytes(reinterpret_cast<const std::byte*>(k.data() + 1));
  const char* p = v.data() + 1;
  r.parent = ChunkKey::FromBytes(reinterpret_cast<const std::byte*>(p));
  p += 16;
  r.ns = ChunkKey::FromBytes(reinterpret_cast<const std::byte*>(p));
  p += 16;
  r.device = Get<uint32_t>(p);
  r.offset = Get<uint64_t>(p);
  r.slot_bytes = Get<uint64_t>(p);
  r.sequence = Get<uint64_t>(p);
  r.payload_checksum = Get<uint64_t>(p);
  return r;
}

NvmeIndex::NvmeIndex(std::unique_ptr<rocksdb::DB> db, std::string dir)
    : db_(std::move(db)), dir_(std::move(dir)) {}
NvmeIndex::~NvmeIndex() {
  if (!db_) return;
  if (!failed_.empty()) {
    (void)db_->Close();  // no flush: the disk refused the last write
    return;
  }
  // Flushed at a clean close, so the next start does not replay the log (with
  // millions of chunks that replay dominated start-up).
  (void)db_->Flush(rocksdb::FlushOptions());
  (void)db_->Close();
}

std::string NvmeIndex::failure() const {
  std::lock_guard lock(mu_);
  return failed_;
}

Status NvmeIndex::Write(rocksdb::WriteBatch& batch, bool sync, const char* what) {
  std::lock_guard lock(mu_);
  if (!failed_.empty()) {
    return Status::IOError(std::string(what) + " NVMe index " + dir_ +
                           ": refused after an earlier write failed (" + failed_ + ")");
  }
  rocksdb::WriteOptions wo;
  wo.sync = sync;
  Status st;
  try {
    st = ToStatus(db_->Write(wo, &batch), std::string(what) + " NVMe index " + dir_);
  } catch (const std::exception& e) {
    // std::bad_alloc from the memtable. RocksDB's write queue is not left in a state that
    // takes another write (the next one waits forever), so this index takes none.
    st = Status::IOError(std::string(what) + " NVMe index " + dir_ + ": " + e.what());
  }
  if (!st.ok()) {
    failed_ = st.message();
    spdlog::error("{}; the NVMe index takes no more writes until kvtierd restarts", st.message());
  }
  return st;
}

Result<std::unique_ptr<NvmeIndex>> NvmeIndex::Open(const std::string& dir, rocksdb::Env* env) {
  rocksdb::Options options;
  if (env != nullptr) options.env = env;
  options.info_log = std::make_shared<SpdlogRocksLogger>(dir);
  options.create_if_missing = true;
  options.paranoid_checks = true;
  // The index shares its disk with slot files sized to fill it, so what it takes is bounded
  // (HeadroomBytes counts on these): a 2 MiB memtable (about 25,000 records; RocksDB's
  // default is 64 MiB), a log of at most 4 MiB before a flush is forced, a manifest rolled
  // over at 4 MiB, and nothing preallocated (RocksDB otherwise reserves 1.1 memtables of log
  // and 4 MiB of manifest at open: 21 MB on a disk that had room for no more).
  options.write_buffer_size = 2 << 20;
  options.max_total_wal_size = 4 << 20;
  options.max_manifest_file_size = 4 << 20;
  options.allow_fallocate = false;
  // Made here so that RocksDB does not log a missing directory as an error.
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);  // a failure is RocksDB's to report
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s;
  try {
    s = rocksdb::DB::Open(options, dir, &raw);
  } catch (const std::exception& e) {
    return Status::IOError("open NVMe index " + dir + ": " + e.what());
  }
  if (!s.ok() && !s.IsCorruption()) {
    return Status::IOError("NVMe index " + dir + " cannot be opened for writing (" + s.ToString() +
                           ")" + kFreeSpaceHint);
  }
  KVTIER_RETURN_IF_ERROR(ToStatus(s, "open NVMe index " + dir));
  std::unique_ptr<NvmeIndex> index(new NvmeIndex(std::unique_ptr<rocksdb::DB>(raw), dir));
  // A start that cannot write the index (a full disk) is refused here, not at
  // the first chunk.
  rocksdb::WriteBatch probe;
  probe.Put(kProbeKey, "");
  if (Status st = index->Write(probe, /*sync=*/true, "probe"); !st.ok()) {
    return Status::IOError("NVMe index " + dir + " cannot be written (" + st.message() + ")" +
                           kFreeSpaceHint);
  }
  return index;
}

Status NvmeIndex::Put(std::span<const NvmeRecord> records) {
  rocksdb::WriteBatch batch;
  for (const NvmeRecord& r : records) {
    const auto [key, value] = EncodeRecord(r);
    batch.Put(key, value);
    if (r.last_access_ms != 0) {
      std::string t;
      kvtier::Put(t, r.last_access_ms);
      batch.Put(DbKey(kAccessPrefix, r.key), t);
    }
  }
  return Write(batch, /*sync=*/true, "write");
}

Status NvmeIndex::Delete(std::span<const ChunkKey> keys) {
  rocksdb::WriteBatch batch;
  for (const ChunkKey& k : keys) {
    batch.Delete(DbKey(kRecordPrefix, k));
    batch.Delete(DbKey(kAccessPrefix, k));
  }
  return Write(batch, /*sync=*/false, "delete from");
}

Status NvmeIndex::PutAccessTimes(std::span<const std::pair<ChunkKey, uint64_t>> times) {
  rocksdb::WriteBatch batch;
  for (const auto& [key, ms] : times) {
    std::string t;
    kvtier::Put(t, ms);
    batch.Put(DbKey(kAccessPrefix, key), t);
  }
  return Write(batch, /*sync=*/false, "write access times to");
}

Status NvmeIndex::ForEach(const std::function<void(const NvmeRecord&)>& fn) const {
  // Access times first, in one scan ('a' sorts before 'c'): a point lookup per
  // record would dominate start-up with millions of chunks.
  std::unordered_map<ChunkKey, uint64_t, ChunkKeyHash> access;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek(std::string(1, kAccessPrefix)); it->Valid(); it->Next()) {
    const rocksdb::Slice k = it->key();
    if (k.size() == 0 || k[0] != kAccessPrefix) break;
    if (k.size() != 1 + ChunkKey::kBytes || it->value().size() != sizeof(uint64_t)) continue;
    const char* q = it->value().data();
    access[ChunkKey::FromBytes(reinterpret_cast<const std::byte*>(k.data() + 1))] =
        Get<uint64_t>(q);
  }
  KVTIER_RETURN_IF_ERROR(ToStatus(it->status(), "read NVMe index " + dir_));
  for (it->Seek(std::string(1, kRecordPrefix)); it->Valid(); it->Next()) {
    const rocksdb::Slice k = it->key();
    if (k.size() == 0 || k[0] != kRecordPrefix) break;
    Result<NvmeRecord> decoded = DecodeRecord(k.ToStringView(), it->value().ToStringView());
    if (!decoded.ok()) {
      return Status::DataLoss("NVMe index " + dir_ + ": " + decoded.status().message());
    }
    NvmeRecord& r = *decoded;
    if (auto a = access.find(r.key); a != access.end()) r.last_access_ms = a->second;
    fn(r);
  }
  return ToStatus(it->status(), "read NVMe index " + dir_);
}

}  // namespace kvtier
