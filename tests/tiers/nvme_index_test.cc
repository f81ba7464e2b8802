// NvmeIndex: the NVMe tier's RocksDB index survives reopening, deletes stick,
// access times merge in, and damage is reported rather than served.
#include "kvtier/tiers/nvme_index.h"

#include <gtest/gtest.h>
#include <unistd.h>

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

}  // namespace
}  // namespace kvtier
