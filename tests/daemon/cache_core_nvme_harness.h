// CacheCoreNvmeTest: CacheCoreHarness with an NVMe tier on a real O_DIRECT
// file and RocksDB in a scratch directory, its device wrapped so that writes
// fail after a given number (FaultInjectionDevice).
#pragma once

#include <unistd.h>

#include <filesystem>

#include "daemon/cache_core_harness.h"
#include "kvtier/tiers/io_uring_file_device.h"
#include "testing/fault_injection_device.h"

namespace kvtier::testing {

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

  // DRAM of `dram_slots` slots over an NVMe device whose writes (with fault_
  // kReadEio: reads) fail after `good_writes`, as fault_ says (default: EIO).
  void StartWithNvme(uint64_t dram_slots, uint64_t good_writes,
                     NvmeWritePolicy policy = NvmeWritePolicy::kWriteThrough,
                     uint64_t write_back_buffer_bytes = uint64_t{256} << 20,
                     bool engine_keyed = false) {
    auto inner = IoUringFileDevice::Open({(dir_ / "slots.dat").string(), 4 << 20, 8, {}});
    ASSERT_TRUE(inner.ok()) << inner.status().ToString();
    inner_ = std::move(inner).value();
    auto faulty = std::make_unique<FaultInjectionDevice>(*inner_, good_writes, fault_);
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
    o.write_back_buffer_bytes = write_back_buffer_bytes;
    o.write_through_wait = write_through_wait_;
    Start(o, std::move(nvme).value(), engine_keyed);
  }

  const v1::TierStats& NvmeStats(v1::StatsResponse& s) {
    s = Stats();
    EXPECT_EQ(s.tiers_size(), 2);
    return s.tiers(1);
  }

  fs::path dir_;
  std::unique_ptr<IoUringFileDevice> inner_;
  FaultInjectionDevice* faulty_ = nullptr;
  Fault fault_ = Fault::kEio;
  std::chrono::milliseconds write_through_wait_{CacheCoreOptions{}.write_through_wait};
};

// Stores `a` (3 chunks) and then a 6-chunk prompt into a DRAM of 6 slots
// (tickets may hold 3), with write-through drained: `a` is on NVMe only.
class CacheCorePrefetchTest : public CacheCoreNvmeTest {
 protected:
  void SetUp() override {
    StartWithNvme(/*dram_slots=*/6, /*good_writes=*/1000);
    ASSERT_EQ(Store(a_), 3u);
    Drain();
    ASSERT_EQ(Store(Tokens(24, 500)), 6u);
    Drain();
    ASSERT_EQ(Lookup(a_, false).nvme_chunks(), 3u);
  }
  void Drain() {
    while (core_->DestageOnce() > 0) {
    }
  }
  const std::vector<int32_t> a_ = Tokens(12);
};

}  // namespace kvtier::testing
