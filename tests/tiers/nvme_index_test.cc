// NvmeIndex: the NVMe tier's RocksDB index survives reopening, deletes stick,
// access times merge in, and damage is reported rather than served.
#include "kvtier/tiers/nvme_index.h"

#include <gtest/gtest.h>
#include <rocksdb/env.h>
#include <rocksdb/file_system.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <vector>

namespace kvtier {
namespace {

namespace fs = std::filesystem;

NvmeRecord Record(uint64_t i) {
  NvmeRecord r;
  r.key = ChunkKey{i, ~i};
  r.parent = ChunkKey{i - 1, ~(i - 1)};
  r.ns = ChunkKey{77, 88};
  r.device = static_cast<uint32_t>(i % 3);
  r.offset = i * 266240;
  r.slot_bytes = 266240;
  r.sequence = 1000 + i;
  r.payload_checksum = i * 0x9E3779B97F4A7C15ULL;
  return r;
}

class NvmeIndexTest : public ::testing::Test {
 protected:
  NvmeIndexTest() : dir_(fs::temp_directory_path() / ("kvtier-idx-" + std::to_string(getpid()))) {}
  ~NvmeIndexTest() override { fs::remove_all(dir_); }

  std::map<uint64_t, NvmeRecord> All(NvmeIndex& idx) {
    std::map<uint64_t, NvmeRecord> out;
    EXPECT_TRUE(idx.ForEach([&](const NvmeRecord& r) { out[r.key.lo] = r; }).ok());
    return out;
  }

  fs::path dir_;
};

TEST_F(NvmeIndexTest, RecordsSurviveReopen) {
  {
    auto idx = NvmeIndex::Open(dir_.string());
    ASSERT_TRUE(idx.ok()) << idx.status().ToString();
    std::vector<NvmeRecord> rs;
    for (uint64_t i = 1; i <= 100; ++i) rs.push_back(Record(i));
    ASSERT_TRUE((*idx)->Put(rs).ok());
  }
  auto idx = NvmeIndex::Open(dir_.string());
  ASSERT_TRUE(idx.ok());
  const auto all = All(**idx);
  ASSERT_EQ(all.size(), 100u);
  for (uint64_t i = 1; i <= 100; ++i) EXPECT_EQ(all.at(i), Record(i)) << i;
}

// Bytes the file system has allocated to the files under `dir` (what df counts, preallocation
// included), not their sizes.
uint64_t AllocatedBytes(const fs::path& dir) {
  uint64_t bytes = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    struct stat st {};
    if (e.is_regular_file() && stat(e.path().c_str(), &st) == 0) {
      bytes += static_cast<uint64_t>(st.st_blocks) * 512;
    }
  }
  return bytes;
}

// On a small NVMe file system the index's preallocated log once took 21 MB at start (1.1 x a
// 16 MiB memtable), filling the disk the slot files were sized for.
TEST_F(NvmeIndexTest, AFreshIndexTakesLittleDiskSpace) {
  auto idx = NvmeIndex::Open(dir_.string());
  ASSERT_TRUE(idx.ok()) << idx.status().ToString();
  std::vector<NvmeRecord> rs;
  for (uint64_t i = 1; i <= 1000; ++i) rs.push_back(Record(i));
  ASSERT_TRUE((*idx)->Put(rs).ok());
  // 1,000 records are about 100 KB; what a start allocates beyond them is a few blocks.
  EXPECT_LE(AllocatedBytes(dir_), uint64_t{1} << 20)
      << "the index at " << dir_ << " allocated more than 1 MiB right after start";
}

TEST_F(NvmeIndexTest, DeletedRecordsStayDeletedAndAccessTimesMergeIn) {
  {
    auto idx = NvmeIndex::Open(dir_.string());
    ASSERT_TRUE(idx.ok());
    std::vector<NvmeRecord> rs = {Record(1), Record(2), Record(3)};
    ASSERT_TRUE((*idx)->Put(rs).ok());
    std::vector<ChunkKey> gone = {Record(2).key};
    ASSERT_TRUE((*idx)->Delete(gone).ok());
    std::vector<std::pair<ChunkKey, uint64_t>> times = {{Record(3).key, 1234567}};
    ASSERT_TRUE((*idx)->PutAccessTimes(times).ok());
  }
  auto idx = NvmeIndex::Open(dir_.string());
  ASSERT_TRUE(idx.ok());
  const auto all = All(**idx);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all.count(2), 0u);
  EXPECT_EQ(all.at(1).last_access_ms, 0u);
  EXPECT_EQ(all.at(3).last_access_ms, 1234567u);
}

TEST_F(NvmeIndexTest, DirectoryThatIsAFileIsAnErrorNamingIt) {
  std::ofstream(dir_.string()) << "not a directory";
  auto idx = NvmeIndex::Open(dir_.string());
  ASSERT_FALSE(idx.ok());
  EXPECT_NE(idx.status().message().find(dir_.string()), std::string::npos)
      << idx.status().message();
  fs::remove(dir_);
}

TEST_F(NvmeIndexTest, DamagedDatabaseIsReportedNotServed) {
  {
    auto idx = NvmeIndex::Open(dir_.string());
    ASSERT_TRUE(idx.ok());
    std::vector<NvmeRecord> rs = {Record(1)};
    ASSERT_TRUE((*idx)->Put(rs).ok());
  }
  // Overwrite every file of the database with garbage.
  for (const auto& e : fs::directory_iterator(dir_)) {
    if (!e.is_regular_file()) continue;
    std::ofstream(e.path(), std::ios::binary | std::ios::trunc) << std::string(4096, '\x5a');
  }
  auto idx = NvmeIndex::Open(dir_.string());
  if (idx.ok()) {
    std::map<uint64_t, NvmeRecord> all;
    const Status st = (*idx)->ForEach([&](const NvmeRecord& r) { all[r.key.lo] = r; });
    EXPECT_TRUE(!st.ok() || all.empty()) << "a damaged index served records";
  } else {
    EXPECT_TRUE(idx.status().code() == StatusCode::kDataLoss ||
                idx.status().code() == StatusCode::kIOError)
        << idx.status().ToString();
    EXPECT_NE(idx.status().message().find(dir_.string()), std::string::npos);
  }
}

// ---- A disk that fills up: the real file system, wrapped so that appends to
// RocksDB's files fail with ENOSPC once `room` bytes have been written. ----

class FillingFile : public rocksdb::FSWritableFileOwnerWrapper {
 public:
  FillingFile(std::unique_ptr<rocksdb::FSWritableFile> file, std::atomic<int64_t>& room)
      : FSWritableFileOwnerWrapper(std::move(file)), room_(room) {}
  rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& options,
                           rocksdb::IODebugContext* dbg) override {
    if (room_.fetch_sub(static_cast<int64_t>(data.size())) < static_cast<int64_t>(data.size())) {
      return rocksdb::IOStatus::NoSpace("injected: no space left on device");
    }
    return FSWritableFileOwnerWrapper::Append(data, options, dbg);
  }
  rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& options,
                           const rocksdb::DataVerificationInfo& /*info*/,
                           rocksdb::IODebugContext* dbg) override {
    return Append(data, options, dbg);
  }

 private:
  std::atomic<int64_t>& room_;
};

class FillingFs : public rocksdb::FileSystemWrapper {
 public:
  FillingFs() : FileSystemWrapper(rocksdb::FileSystem::Default()) {}
  const char* Name() const override { return "FillingFs"; }
  rocksdb::IOStatus NewWritableFile(const std::string& name, const rocksdb::FileOptions& options,
                                    std::unique_ptr<rocksdb::FSWritableFile>* result,
                                    rocksdb::IODebugContext* dbg) override {
    std::unique_ptr<rocksdb::FSWritableFile> file;
    rocksdb::IOStatus s = target()->NewWritableFile(name, options, &file, dbg);
    if (s.ok()) *result = std::make_unique<FillingFile>(std::move(file), room);
    return s;
  }
  std::atomic<int64_t> room{int64_t{1} << 40};
};

TEST_F(NvmeIndexTest, AFullDiskFailsWritesWithIoErrorsAndNeverAborts) {
  auto fs = std::make_shared<FillingFs>();
  std::unique_ptr<rocksdb::Env> env = rocksdb::NewCompositeEnv(fs);
  {
    auto idx = NvmeIndex::Open(dir_.string(), env.get());
    ASSERT_TRUE(idx.ok()) << idx.status().ToString();
    ASSERT_TRUE((*idx)->Put(std::vector<NvmeRecord>{Record(1)}).ok());
    fs->room = 0;                  // the disk is full from now on
    for (int i = 2; i < 6; ++i) {  // RocksDB 7.8 aborted on the second failed write
      const Status st = (*idx)->Put(std::vector<NvmeRecord>{Record(i)});
      EXPECT_EQ(st.code(), StatusCode::kIOError) << st.ToString();
      const Status del = (*idx)->Delete(std::vector<ChunkKey>{Record(1).key});
      EXPECT_EQ(del.code(), StatusCode::kIOError) << del.ToString();
      EXPECT_NE(del.message().find(dir_.string()), std::string::npos) << del.message();
    }
  }  // closed with the disk still full: no abort
  // A start on the full disk is refused with an error that says so.
  auto full = NvmeIndex::Open(dir_.string(), env.get());
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.status().code(), StatusCode::kIOError);
  EXPECT_NE(full.status().message().find("free space"), std::string::npos)
      << full.status().ToString();
  EXPECT_NE(full.status().message().find(dir_.string()), std::string::npos)
      << full.status().ToString();
  // Space again: what was durable before the disk filled is there.
  fs->room = int64_t{1} << 40;
  auto idx = NvmeIndex::Open(dir_.string(), env.get());
  ASSERT_TRUE(idx.ok()) << idx.status().ToString();
  const auto all = All(**idx);
  ASSERT_EQ(all.count(1), 1u);
  EXPECT_EQ(all.at(1), Record(1));
}

}  // namespace
}  // namespace kvtier
