// CacheCore with an NVMe tier on real O_DIRECT files and RocksDB: write-through,
// promotion into DRAM on a lookup with lease, and I/O faults injected by
// wrapping the real device (degraded tier; DRAM keeps serving; no errors).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "daemon/cache_core_harness.h"
#include "kvtier/daemon/cache_core.h"
#include "kvtier/tiers/io_uring_file_device.h"
#include "testing/fault_injection_device.h"

namespace kvtier::testing {
namespace {

namespace fs = std::filesystem;

class CacheCoreNvmeTest : public CacheCoreHarness {
 protected:
  CacheCoreNvmeTest() : dir_(fs::current_path() / ("core-nvme-" + std::to_string(getpid()))) {
    fs::create_directories(dir_);
  }
  ~CacheCoreNvmeTest() override {
    core_.reset();
    fs::remove_all(dir_);
  }

  // DRAM of `dram_slots` slots over an NVMe device whose writes fail after
  // `good_writes`.
  void StartWithNvme(uint64_t dram_slots, uint64_t good_writes,
                     NvmeWritePolicy policy = NvmeWritePolicy::kWriteThrough) {
    auto inner = IoUringFileDevice::Open({(dir_ / "slots.dat").string(), 4 << 20, 8});
    ASSERT_TRUE(inner.ok()) << inner.status().ToString();
    inner_ = std::move(inner).value();
    auto faulty = std::make_unique<FaultInjectionDevice>(*inner_, good_writes);
    faulty_ = faulty.get();
    std::vector<std::unique_ptr<BlockDevice>> devices;
    devices.push_back(std::move(faulty));
    auto index = NvmeIndex::Open((dir_ / "index").string());
    ASSERT_TRUE(index.ok());
    auto nvme = NvmeTier::Create(std::move(devices), std::move(index).value());
    ASSERT_TRUE(nvme.ok()) << nvme.status().ToString();
    CacheCoreOptions o = Options(dram_slots);
    o.nvme_write_policy = policy;
    o.selective_min_hits = 2;
    Start(o, std::move(nvme).value());
  }

  const v1::TierStats& NvmeStats(v1::StatsResponse& s) {
    s = Stats();
    EXPECT_EQ(s.tiers_size(), 2);
    return s.tiers(1);
  }

  fs::path dir_;
  std::unique_ptr<IoUringFileDevice> inner_;
  FaultInjectionDevice* faulty_ = nullptr;
};

TEST_F(CacheCoreNvmeTest, WriteThroughThenPromotionServesTheSameBytes) {
  StartWithNvme(/*dram_slots=*/3, /*good_writes=*/1000);
  const auto a = Tokens(12);       // 3 chunks
  ASSERT_EQ(Store(a), 3u);
  while (core_->WriteThroughOnce() > 0) {
  }
  v1::StatsResponse s;
  EXPECT_EQ(NvmeStats(s).chunks(), 3u);
  EXPECT_EQ(NvmeStats(s).pending_writes(), 0u);
  // Push a's chunks out of DRAM with another prompt.
  ASSERT_EQ(Store(Tokens(12, 500)), 3u);
  while (core_->WriteThroughOnce() > 0) {
  }
  EXPECT_EQ(Lookup(a, false).num_chunks(), 3u) << "on NVMe, so still cached";
  const v1::LookupResponse l = Lookup(a, true);
  ASSERT_EQ(l.num_chunks(), 3u);
  EXPECT_EQ(l.nvme_chunks(), 3u);
  EXPECT_TRUE(LeasedBytesMatch(a, l)) << "promoted bytes differ from what was stored";
  EXPECT_GT(NvmeStats(s).hits(), 0u);
}

TEST_F(CacheCoreNvmeTest, FailingWritesDegradeTheTierWhileDramKeepsServing) {
  StartWithNvme(/*dram_slots=*/8, /*good_writes=*/0);
  for (int i = 0; i < 4; ++i) {
    const auto t = Tokens(4, 1000 * (i + 1));
    ASSERT_EQ(Store(t), 1u) << "DRAM stores even when NVMe fails";
    while (core_->WriteThroughOnce() > 0) {
    }
    EXPECT_EQ(Lookup(t, false).num_chunks(), 1u);
  }
  v1::StatsResponse s;
  EXPECT_TRUE(NvmeStats(s).degraded());
  EXPECT_GE(NvmeStats(s).io_errors(), CacheCore::kNvmeDegradedAfter);
  EXPECT_EQ(NvmeStats(s).chunks(), 0u);
  EXPECT_EQ(core_->DegradedTiers(), std::vector<std::string>{"nvme"});
  EXPECT_EQ(s.active_leases(), 0u);
  // A working device again: the next success clears the degraded state.
  faulty_->set_good_writes(100);
  ASSERT_EQ(Store(Tokens(4, 9000)), 1u);
  while (core_->WriteThroughOnce() > 0) {
  }
  EXPECT_FALSE(NvmeStats(s).degraded());
  EXPECT_TRUE(core_->DegradedTiers().empty());
}

TEST_F(CacheCoreNvmeTest, SelectivePolicyWritesAChunkOnlyAfterItsSecondHit) {
  StartWithNvme(/*dram_slots=*/8, /*good_writes=*/1000, NvmeWritePolicy::kSelective);
  const auto a = Tokens(8);  // 2 chunks
  ASSERT_EQ(Store(a), 2u);
  const auto drain = [&] {
    while (core_->WriteThroughOnce() > 0) {
    }
  };
  drain();
  v1::StatsResponse s;
  EXPECT_EQ(NvmeStats(s).chunks(), 0u) << "selective: nothing goes down at commit";
  EXPECT_EQ(Lookup(a, false).num_chunks(), 2u);
  drain();
  EXPECT_EQ(NvmeStats(s).chunks(), 0u) << "one hit is not enough";
  EXPECT_EQ(Lookup(a, false).num_chunks(), 2u);
  drain();
  EXPECT_EQ(NvmeStats(s).chunks(), 2u) << "the second hit sends both chunks, parent first";
  EXPECT_EQ(NvmeStats(s).pending_writes(), 0u);
  EXPECT_EQ(s.active_leases(), 0u);
}

}  // namespace
}  // namespace kvtier::testing
