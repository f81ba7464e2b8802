// The fault campaign (issue 10): a real O_DIRECT file and RocksDB index under
// CacheCore, the device wrapped to fail as a disk does (EIO, a short write, a
// torn write it does not report, failing reads). In each case DRAM serves on
// with the right bytes, a counter rises, nothing half-written is served after
// a restart, and the core stops cleanly.
#include <gtest/gtest.h>

#include "daemon/cache_core_nvme_harness.h"

namespace kvtier::testing {
namespace {

struct Case {
  const char* name;
  Fault fault;
};

class CacheCoreFaultTest : public CacheCoreNvmeTest, public ::testing::WithParamInterface<Case> {
 protected:
  // DRAM of 8 slots; from the first write (or read) on, the device fails.
  void StartFaulty() {
    fault_ = GetParam().fault;
    StartWithNvme(/*dram_slots=*/8, /*good_writes=*/0);
  }
  // A restart on the same slot file and index, the disk healthy again
  // (reads still fail for kReadEio: the disk is what it is).
  void Restart() {
    core_.reset();
    inner_.reset();  // the slot file's lock goes with it
    if (GetParam().fault != Fault::kReadEio) fault_ = Fault::kEio;
    StartWithNvme(/*dram_slots=*/8, /*good_writes=*/GetParam().fault == Fault::kReadEio ? 0 : 1000);
  }
  void Drain() {
    while (core_->DestageOnce() > 0) {
    }
  }
};

TEST_P(CacheCoreFaultTest, DramServesOnCountersRiseAndNothingHalfWrittenIsServedAfterARestart) {
  const bool read_fault = GetParam().fault == Fault::kReadEio;
  if (read_fault) fault_ = Fault::kReadEio;
  StartFaulty();
  const auto a = Tokens(16);  // 4 chunks
  ASSERT_EQ(Store(a), 4u);
  Drain();
  v1::StatsResponse s;
  const v1::TierStats nvme = NvmeStats(s);
  switch (GetParam().fault) {
    case Fault::kEio:
    case Fault::kShortWrite:
      EXPECT_GE(nvme.io_errors(), 1u);
      EXPECT_EQ(nvme.lost_writes(), 4u) << "every chunk handed to the writer is counted lost";
      EXPECT_EQ(nvme.chunks(), 0u) << "a failed batch indexes nothing";
      break;
    case Fault::kTornWrite:  // the device said OK: only verification can tell
      EXPECT_EQ(nvme.io_errors(), 0u);
      EXPECT_EQ(nvme.chunks(), 4u);
      break;
    case Fault::kReadEio:
      EXPECT_EQ(nvme.chunks(), 4u);
      break;
  }
  // DRAM serves on, with the stored bytes.
  const v1::LookupResponse dram = Lookup(a, true);
  EXPECT_EQ(dram.num_chunks(), 4u);
  EXPECT_TRUE(LeasedBytesMatch(a, dram));
  ASSERT_TRUE(Release(dram.lease_id()).ok());

  // After a restart DRAM is empty: whatever comes back comes from NVMe, and
  // is served only if every byte verifies.
  Restart();
  const v1::LookupResponse after = Lookup(a, true);
  EXPECT_TRUE(LeasedBytesMatch(a, after)) << "wrong bytes served after a restart";
  EXPECT_EQ(after.num_chunks(), 0u) << "no chunk of a failed write comes back";
  const v1::TierStats restarted = NvmeStats(s);
  if (GetParam().fault == Fault::kTornWrite) {
    EXPECT_GE(restarted.corrupt_reads(), 1u) << "the torn image failed its checksum";
  }
  if (read_fault) {
    EXPECT_GE(restarted.io_errors(), 1u);
  }
  if (after.lease_id() != 0) {
    ASSERT_TRUE(Release(after.lease_id()).ok());
  }
  // A store after the restart: DRAM still takes and serves it.
  const auto b = Tokens(8, 900);
  ASSERT_EQ(Store(b), 2u);
  const v1::LookupResponse fresh = Lookup(b, true);
  EXPECT_EQ(fresh.num_chunks(), 2u);
  EXPECT_TRUE(LeasedBytesMatch(b, fresh));
  ASSERT_TRUE(Release(fresh.lease_id()).ok());
  core_.reset();  // a clean stop: the workers join, the index closes
}

INSTANTIATE_TEST_SUITE_P(
    Faults, CacheCoreFaultTest,
    ::testing::Values(Case{"eio", Fault::kEio}, Case{"short_write", Fault::kShortWrite},
                      Case{"torn_write", Fault::kTornWrite}, Case{"read_eio", Fault::kReadEio}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace kvtier::testing
