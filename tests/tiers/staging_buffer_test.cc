// StagingBuffer: one aligned region, reused while big enough, grown when not.
#include "kvtier/tiers/staging_buffer.h"

#include <gtest/gtest.h>

#include <cstring>

namespace kvtier {
namespace {

TEST(StagingBuffer, ARegionIsPageAlignedAndRoundedUpToPages) {
  StagingBuffer s;
  EXPECT_EQ(s.capacity_bytes(), 0u);
  std::byte* p = s.Reserve(5000);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 4096, 0u);
  EXPECT_EQ(s.capacity_bytes(), 8192u);
  std::memset(p, 0x5a, 8192);  // all of it is ours (ASan checks)
}

TEST(StagingBuffer, ASmallerOrEqualRequestReusesTheRegion) {
  StagingBuffer s;
  std::byte* p = s.Reserve(1 << 20);
  p[0] = std::byte{7};
  EXPECT_EQ(s.Reserve(4096), p);
  EXPECT_EQ(s.Reserve(1 << 20), p);
  EXPECT_EQ(p[0], std::byte{7});  // kept: no new allocation
  EXPECT_EQ(s.capacity_bytes(), uint64_t{1} << 20);
}

TEST(StagingBuffer, ALargerRequestGrowsTheRegion) {
  StagingBuffer s;
  s.Reserve(4096);
  std::byte* p = s.Reserve(3 << 20);
  EXPECT_EQ(s.capacity_bytes(), uint64_t{3} << 20);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 4096, 0u);
  std::memset(p, 0, 3 << 20);
}

}  // namespace
}  // namespace kvtier
