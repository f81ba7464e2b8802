// NewLeafFirstLruPolicy: least recently used first, among evictable handles.
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "kvtier/tiers/eviction_policy.h"

namespace kvtier {
namespace {

const auto kAny = [](uint32_t) { return true; };

// Victims in order, removing each one, until none is left.
std::vector<uint32_t> Drain(EvictionPolicy& p) {
  std::vector<uint32_t> order;
  while (auto v = p.PickVictim(kAny)) {
    order.push_back(*v);
    p.OnRemove(*v);
    if (order.size() > 1000) break;  // a broken list must not hang the test
  }
  return order;
}

TEST(LeafFirstLru, EmptyPolicyHasNoVictim) {
  auto p = NewLeafFirstLruPolicy();
  EXPECT_FALSE(p->PickVictim(kAny).has_value());
}

TEST(LeafFirstLru, VictimsComeInInsertionOrder) {
  auto p = NewLeafFirstLruPolicy();
  for (uint32_t h : {0u, 1u, 2u, 3u}) p->OnInsert(h);
  EXPECT_EQ(Drain(*p), (std::vector<uint32_t>{0, 1, 2, 3}));
}

TEST(LeafFirstLru, AccessMakesAHandleMostRecent) {
  auto p = NewLeafFirstLruPolicy();
  for (uint32_t h : {0u, 1u, 2u, 3u}) p->OnInsert(h);
  p->OnAccess(0);
  p->OnAccess(2);
  EXPECT_EQ(Drain(*p), (std::vector<uint32_t>{1, 3, 0, 2}));
}

TEST(LeafFirstLru, AccessOfTheMostRecentKeepsOrder) {
  auto p = NewLeafFirstLruPolicy();
  for (uint32_t h : {0u, 1u, 2u}) p->OnInsert(h);
  p->OnAccess(2);
  p->OnAccess(2);
  EXPECT_EQ(Drain(*p), (std::vector<uint32_t>{0, 1, 2}));
}

TEST(LeafFirstLru, VictimSkipsNonEvictableHandles) {
  auto p = NewLeafFirstLruPolicy();
  for (uint32_t h : {0u, 1u, 2u, 3u}) p->OnInsert(h);
  const std::set<uint32_t> pinned = {0, 1};
  auto v = p->PickVictim([&](uint32_t h) { return pinned.count(h) == 0; });
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(*v, 2u);
}

TEST(LeafFirstLru, NothingEvictableMeansNoVictim) {
  auto p = NewLeafFirstLruPolicy();
  for (uint32_t h : {0u, 1u, 2u}) p->OnInsert(h);
  std::vector<uint32_t> asked;
  auto v = p->PickVictim([&](uint32_t h) {
    asked.push_back(h);
    return false;
  });
  EXPECT_FALSE(v.has_value());
  EXPECT_EQ(asked, (std::vector<uint32_t>{0, 1, 2}));  // asked LRU first, each once
}

TEST(LeafFirstLru, RemovedHandlesAreNeverPicked) {
  auto p = NewLeafFirstLruPolicy();
  for (uint32_t h : {0u, 1u, 2u, 3u, 4u}) p->OnInsert(h);
  p->OnRemove(0);  // tail
  p->OnRemove(4);  // head
  p->OnRemove(2);  // middle
  EXPECT_EQ(Drain(*p), (std::vector<uint32_t>{1, 3}));
}

TEST(LeafFirstLru, ReusedHandleIsMostRecent) {
  auto p = NewLeafFirstLruPolicy();
  for (uint32_t h : {0u, 1u, 2u}) p->OnInsert(h);
  p->OnRemove(0);
  p->OnInsert(0);  // the index reuses freed handles
  EXPECT_EQ(Drain(*p), (std::vector<uint32_t>{1, 2, 0}));
}

TEST(LeafFirstLru, SparseHandlesWork) {
  auto p = NewLeafFirstLruPolicy();
  p->OnInsert(100);
  p->OnInsert(7);
  p->OnAccess(100);
  EXPECT_EQ(Drain(*p), (std::vector<uint32_t>{7, 100}));
}

TEST(LeafFirstLru, SingleHandleRemoveAndReinsert) {
  auto p = NewLeafFirstLruPolicy();
  p->OnInsert(0);
  p->OnRemove(0);
  EXPECT_FALSE(p->PickVictim(kAny).has_value());
  p->OnInsert(0);
  EXPECT_EQ(p->PickVictim(kAny), std::optional<uint32_t>(0));
}

}  // namespace
}  // namespace kvtier
