// NewLeafFirstLruPolicy: least recently used first, within a size class, among
// the chunks the tier judges evictable; chunks that cannot go are set aside.
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "kvtier/tiers/eviction_policy.h"

namespace kvtier {
namespace {

using Verdict = EvictionPolicy::Verdict;
constexpr uint64_t kClass = 4096;
const auto kAny = [](uint32_t) { return Verdict::kEvict; };

std::optional<uint32_t> Pick(EvictionPolicy& p, uint64_t cls = kClass) {
  return p.PickVictim(cls, /*take_held=*/false, kAny);
}

// Victims in order, removing each one, until none is left.
std::vector<uint32_t> Drain(EvictionPolicy& p, uint64_t cls = kClass) {
  std::vector<uint32_t> order;
  while (auto v = Pick(p, cls)) {
    order.push_back(*v);
    p.OnRemove(*v);
    if (order.size() > 1000) break;  // a broken list must not hang the test
  }
  return order;
}

std::unique_ptr<EvictionPolicy> With(std::initializer_list<uint32_t> handles) {
  auto p = NewLeafFirstLruPolicy();
  for (uint32_t h : handles) p->OnInsert(h, kClass);
  return p;
}

TEST(LeafFirstLru, EmptyPolicyHasNoVictim) {
  auto p = NewLeafFirstLruPolicy();
  EXPECT_FALSE(Pick(*p).has_value());
  EXPECT_FALSE(Pick(*p, EvictionPolicy::kAnyClass).has_value());
}

TEST(LeafFirstLru, VictimsComeInInsertionOrder) {
  auto p = With({0, 1, 2, 3});
  EXPECT_EQ(Drain(*p), (std::vector<uint32_t>{0, 1, 2, 3}));
}

TEST(LeafFirstLru, AccessMakesAHandleMostRecent) {
  auto p = With({0, 1, 2, 3});
  p->OnAccess(0);
  p->OnAccess(2);
  EXPECT_EQ(Drain(*p), (std::vector<uint32_t>{1, 3, 0, 2}));
}

TEST(LeafFirstLru, AccessOfTheMostRecentKeepsOrder) {
  auto p = With({0, 1, 2});
  p->OnAccess(2);
  p->OnAccess(2);
  EXPECT_EQ(Drain(*p), (std::vector<uint32_t>{0, 1, 2}));
}

TEST(LeafFirstLru, ABlockedHandleIsSetAsideAndNotAskedAgain) {
  auto p = With({0, 1, 2, 3});
  const std::set<uint32_t> blocked = {0, 1};
  std::vector<uint32_t> asked;
  auto verdict = [&](uint32_t h) {
    asked.push_back(h);
    return blocked.count(h) ? Verdict::kBlocked : Verdict::kEvict;
  };
  EXPECT_EQ(p->PickVictim(kClass, false, verdict), std::optional<uint32_t>(2));
  p->OnRemove(2);
  EXPECT_EQ(p->PickVictim(kClass, false, verdict), std::optional<uint32_t>(3));
  EXPECT_EQ(asked, (std::vector<uint32_t>{0, 1, 2, 3}));  // 0 and 1 asked once
}

TEST(LeafFirstLru, NothingEvictableMeansNoVictimAndEachIsAskedOnce) {
  auto p = With({0, 1, 2});
  std::vector<uint32_t> asked;
  auto blocked = [&](uint32_t h) {
    asked.push_back(h);
    return Verdict::kBlocked;
  };
  EXPECT_FALSE(p->PickVictim(kClass, false, blocked).has_value());
  EXPECT_FALSE(p->PickVictim(kClass, true, blocked).has_value());
  EXPECT_EQ(asked, (std::vector<uint32_t>{0, 1, 2}));  // LRU first, each once in all
}

TEST(LeafFirstLru, AnUnblockedHandleComesBackAtTheLeastRecentEnd) {
  auto p = With({0, 1, 2, 3});
  auto first_blocked = [](uint32_t h) { return h == 0 ? Verdict::kBlocked : Verdict::kEvict; };
  EXPECT_EQ(p->PickVictim(kClass, false, first_blocked), std::optional<uint32_t>(1));
  p->OnUnblocked(0);
  p->OnUnblocked(3);  // never set aside: stays where it is
  EXPECT_EQ(Drain(*p), (std::vector<uint32_t>{0, 1, 2, 3}));
}

TEST(LeafFirstLru, AnAccessBringsASetAsideHandleBackAsTheMostRecent) {
  auto p = With({0, 1, 2});
  auto first_blocked = [](uint32_t h) { return h == 0 ? Verdict::kBlocked : Verdict::kEvict; };
  EXPECT_EQ(p->PickVictim(kClass, false, first_blocked), std::optional<uint32_t>(1));
  p->OnAccess(0);
  EXPECT_EQ(Drain(*p), (std::vector<uint32_t>{1, 2, 0}));
}

TEST(LeafFirstLru, HeldHandlesGoOnlyWhenAskedAndThenOldestFirst) {
  auto p = With({0, 1, 2, 3});
  std::set<uint32_t> held = {0, 2};
  auto verdict = [&](uint32_t h) { return held.count(h) ? Verdict::kHeld : Verdict::kEvict; };
  EXPECT_EQ(p->PickVictim(kClass, false, verdict), std::optional<uint32_t>(1));
  p->OnRemove(1);
  EXPECT_EQ(p->PickVictim(kClass, false, verdict), std::optional<uint32_t>(3));
  p->OnRemove(3);
  EXPECT_FALSE(p->PickVictim(kClass, false, verdict).has_value());
  EXPECT_EQ(p->PickVictim(kClass, true, verdict), std::optional<uint32_t>(0));
  p->OnRemove(0);
  held.erase(2);
  p->OnUnblocked(2);  // its write is done: an ordinary victim again
  EXPECT_EQ(p->PickVictim(kClass, false, verdict), std::optional<uint32_t>(2));
}

TEST(LeafFirstLru, AVictimIsOfTheAskedClassAndOtherClassesAreNotAsked) {
  auto p = NewLeafFirstLruPolicy();
  p->OnInsert(0, 8192);
  p->OnInsert(1, kClass);
  p->OnInsert(2, 8192);
  std::vector<uint32_t> asked;
  auto verdict = [&](uint32_t h) {
    asked.push_back(h);
    return Verdict::kEvict;
  };
  EXPECT_EQ(p->PickVictim(kClass, false, verdict), std::optional<uint32_t>(1));
  EXPECT_EQ(asked, (std::vector<uint32_t>{1}));
  EXPECT_FALSE(p->PickVictim(12288, false, verdict).has_value());  // a class never seen
  EXPECT_EQ(Drain(*p, 8192), (std::vector<uint32_t>{0, 2}));
}

TEST(LeafFirstLru, AnyClassPicksTheLeastRecentOfEachClassesPick) {
  auto p = NewLeafFirstLruPolicy();
  p->OnInsert(0, kClass);
  p->OnInsert(1, 8192);
  p->OnInsert(2, kClass);
  p->OnAccess(0);
  EXPECT_EQ(Drain(*p, EvictionPolicy::kAnyClass), (std::vector<uint32_t>{1, 2, 0}));
}

TEST(LeafFirstLru, RemovedHandlesAreNeverPicked) {
  auto p = With({0, 1, 2, 3, 4});
  p->OnRemove(0);  // tail
  p->OnRemove(4);  // head
  p->OnRemove(2);  // middle
  p->OnUnblocked(2);  // ignored: not in the policy
  p->OnUnblocked(99);
  EXPECT_EQ(Drain(*p), (std::vector<uint32_t>{1, 3}));
}

TEST(LeafFirstLru, ASetAsideHandleCanBeRemoved) {
  auto p = With({0, 1});
  auto first_blocked = [](uint32_t h) { return h == 0 ? Verdict::kBlocked : Verdict::kEvict; };
  EXPECT_EQ(p->PickVictim(kClass, false, first_blocked), std::optional<uint32_t>(1));
  p->OnRemove(0);
  p->OnUnblocked(0);
  EXPECT_EQ(Drain(*p), (std::vector<uint32_t>{1}));
}

TEST(LeafFirstLru, ReusedHandleIsMostRecent) {
  auto p = With({0, 1, 2});
  p->OnRemove(0);
  p->OnInsert(0, kClass);  // the index reuses freed handles
  EXPECT_EQ(Drain(*p), (std::vector<uint32_t>{1, 2, 0}));
}

TEST(LeafFirstLru, SparseHandlesWork) {
  auto p = With({100, 7});
  p->OnAccess(100);
  EXPECT_EQ(Drain(*p), (std::vector<uint32_t>{7, 100}));
}

TEST(LeafFirstLru, SingleHandleRemoveAndReinsert) {
  auto p = With({0});
  p->OnRemove(0);
  EXPECT_FALSE(Pick(*p).has_value());
  p->OnInsert(0, kClass);
  EXPECT_EQ(Pick(*p), std::optional<uint32_t>(0));
}

}  // namespace
}  // namespace kvtier
