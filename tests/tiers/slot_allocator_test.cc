// SlotAllocator: best-fit allocation from coalescing free extents, exact capacity.
#include "kvtier/tiers/slot_allocator.h"

#include <gtest/gtest.h>

#include <optional>
#include <set>
#include <vector>

namespace kvtier {
namespace {

constexpr uint64_t kSlot = 12288;  // 3 pages: arena sizes below are not multiples of it

TEST(SlotAllocator, CapacityIsArenaBytesDividedBySlotBytes) {
  const uint64_t arena = 1 << 20;
  SlotAllocator a(arena);
  uint64_t n = 0;
  std::set<uint64_t> offsets;
  while (auto off = a.Allocate(kSlot)) {
    EXPECT_EQ(*off % kSlot, 0u);
    EXPECT_LE(*off + kSlot, arena);
    EXPECT_TRUE(offsets.insert(*off).second) << "offset handed out twice: " << *off;
    ++n;
  }
  EXPECT_EQ(n, arena / kSlot);  // 85
  EXPECT_EQ(a.used_bytes(), n * kSlot);
  EXPECT_EQ(a.capacity_bytes(), arena);
}

TEST(SlotAllocator, ExactFitUsesTheWholeArena) {
  SlotAllocator a(4 * 4096);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(a.Allocate(4096).has_value()) << i;
  EXPECT_FALSE(a.Allocate(4096).has_value());
  EXPECT_EQ(a.used_bytes(), 4u * 4096);
}

TEST(SlotAllocator, FreedSlotIsReusedAndUsedBytesTracks) {
  SlotAllocator a(3 * kSlot);
  const auto s0 = a.Allocate(kSlot);
  const auto s1 = a.Allocate(kSlot);
  const auto s2 = a.Allocate(kSlot);
  ASSERT_TRUE(s0 && s1 && s2);
  ASSERT_FALSE(a.Allocate(kSlot).has_value());
  a.Free(*s1, kSlot);
  EXPECT_EQ(a.used_bytes(), 2 * kSlot);
  const auto again = a.Allocate(kSlot);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(*again, *s1);
  EXPECT_EQ(a.used_bytes(), 3 * kSlot);
  a.Free(*s0, kSlot);
  a.Free(*s2, kSlot);
  a.Free(*again, kSlot);
  EXPECT_EQ(a.used_bytes(), 0u);
}

TEST(SlotAllocator, FreedNeighboursCoalesceAndServeALargerSize) {
  SlotAllocator a(4 * 4096);
  std::vector<uint64_t> small;
  for (int i = 0; i < 4; ++i) small.push_back(*a.Allocate(4096));
  ASSERT_FALSE(a.Allocate(2 * 4096).has_value());
  a.Free(small[0], 4096);
  a.Free(small[2], 4096);  // two free slots, not adjacent
  EXPECT_EQ(a.num_free_extents(), 2u);
  EXPECT_FALSE(a.Allocate(2 * 4096).has_value());
  a.Free(small[1], 4096);  // joins both neighbours
  EXPECT_EQ(a.num_free_extents(), 1u);
  EXPECT_EQ(a.Allocate(3 * 4096), std::optional<uint64_t>(0));
  EXPECT_EQ(a.used_bytes(), 4u * 4096);
}

TEST(SlotAllocator, FreedLargeSlotServesSmallerOnes) {
  SlotAllocator a(2 * 4096);
  const auto big = a.Allocate(2 * 4096);
  ASSERT_TRUE(big.has_value());
  a.Free(*big, 2 * 4096);
  const auto x = a.Allocate(4096);
  const auto y = a.Allocate(4096);
  ASSERT_TRUE(x && y);
  EXPECT_NE(*x, *y);
  EXPECT_FALSE(a.Allocate(4096).has_value());
}

TEST(SlotAllocator, AllocateTakesTheBestFittingExtent) {
  SlotAllocator a(8 * 4096);
  std::vector<uint64_t> s;
  for (int i = 0; i < 8; ++i) s.push_back(*a.Allocate(4096));
  a.Free(s[0], 4096);  // extent of 3 slots: [0, 3)
  a.Free(s[1], 4096);
  a.Free(s[2], 4096);
  a.Free(s[5], 4096);                 // extent of 1 slot: [5, 6)
  EXPECT_EQ(a.Allocate(4096), s[5]);  // the exact fit, not a piece of the larger extent
  EXPECT_EQ(a.Allocate(3 * 4096), s[0]);
}

TEST(SlotAllocator, MixedSizesNeverOverlap) {
  SlotAllocator a(64 * 4096);
  struct Range {
    uint64_t off, len;
  };
  std::vector<Range> got;
  for (int i = 0;; ++i) {
    const uint64_t len = (i % 3 + 1) * 4096;
    auto off = a.Allocate(len);
    if (!off) break;
    got.push_back({*off, len});
  }
  ASSERT_GT(got.size(), 10u);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_LE(got[i].off + got[i].len, 64u * 4096);
    for (size_t j = i + 1; j < got.size(); ++j) {
      const bool disjoint =
          got[i].off + got[i].len <= got[j].off || got[j].off + got[j].len <= got[i].off;
      EXPECT_TRUE(disjoint) << i << " and " << j;
    }
  }
}

TEST(SlotAllocator, SlotLargerThanArenaIsRefused) {
  SlotAllocator a(4096);
  EXPECT_FALSE(a.Allocate(8192).has_value());
  EXPECT_EQ(a.used_bytes(), 0u);
  EXPECT_TRUE(a.Allocate(4096).has_value());
}

}  // namespace
}  // namespace kvtier
