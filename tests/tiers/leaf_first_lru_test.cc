// The leaf-first eviction policies: NewLeafFirstLruPolicy (least recently used
// first), NewS3FifoPolicy and NewArcPolicy, within a size class, among the
// chunks the tier judges evictable; chunks that cannot go are set aside. The
// behaviour all share runs on each (on these small cases S3-FIFO's and ARC's
// orders are the LRU's: worked by hand for each); their own at the end.
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

class LeafFirstPolicy : public ::testing::TestWithParam<EvictionPolicyKind> {
 protected:
  std::unique_ptr<EvictionPolicy> New() const { return NewEvictionPolicy(GetParam()); }
  // Each handle with a fingerprint of its own.
  std::unique_ptr<EvictionPolicy> With(std::initializer_list<uint32_t> handles) const {
    auto p = New();
    for (uint32_t h : handles) p->OnInsert(h, kClass, 1000 + h);
    return p;
  }
};

INSTANTIATE_TEST_SUITE_P(Policies, LeafFirstPolicy,
                         ::testing::Values(EvictionPolicyKind::kLru, EvictionPolicyKind::kS3Fifo,
                                           EvictionPolicyKind::kArc),
                         [](const auto& info) { return EvictionPolicyName(info.param); });

TEST_P(LeafFirstPolicy, EmptyPolicyHasNoVictim) {
  auto p = New();
  EXPECT_FALSE(Pick(*p).has_value());
  EXPECT_FALSE(Pick(*p, EvictionPolicy::kAnyClass).has_value());
}

TEST_P(LeafFirstPolicy, VictimsComeInInsertionOrder) {
  auto p = With({0, 1, 2, 3});
  EXPECT_EQ(Drain(*p), (std::vector<uint32_t>{0, 1, 2, 3}));
}

TEST_P(LeafFirstPolicy, AccessMakesAHandleMostRecent) {
  auto p = With({0, 1, 2, 3});
  p->OnAccess(0);
  p->OnAccess(2);
  EXPECT_EQ(Drain(*p), (std::vector<uint32_t>{1, 3, 0, 2}));
}

TEST_P(LeafFirstPolicy, AccessOfTheMostRecentKeepsOrder) {
  auto p = With({0, 1, 2});
  p->OnAccess(2);
  p->OnAccess(2);
  EXPECT_EQ(Drain(*p), (std::vector<uint32_t>{0, 1, 2}));
}

TEST_P(LeafFirstPolicy, ABlockedHandleIsSetAsideAndNotAskedAgain) {
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

TEST_P(LeafFirstPolicy, NothingEvictableMeansNoVictimAndEachIsAskedOnce) {
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

TEST_P(LeafFirstPolicy, AnUnblockedHandleComesBackAtTheLeastRecentEnd) {
  auto p = With({0, 1, 2, 3});
  auto first_blocked = [](uint32_t h) { return h == 0 ? Verdict::kBlocked : Verdict::kEvict; };
  EXPECT_EQ(p->PickVictim(kClass, false, first_blocked), std::optional<uint32_t>(1));
  p->OnUnblocked(0);
  p->OnUnblocked(3);  // never set aside: stays where it is
  EXPECT_EQ(Drain(*p), (std::vector<uint32_t>{0, 1, 2, 3}));
}

TEST_P(LeafFirstPolicy, AnAccessBringsASetAsideHandleBackAsTheMostRecent) {
  auto p = With({0, 1, 2});
  auto first_blocked = [](uint32_t h) { return h == 0 ? Verdict::kBlocked : Verdict::kEvict; };
  EXPECT_EQ(p->PickVictim(kClass, false, first_blocked), std::optional<uint32_t>(1));
  p->OnAccess(0);
  EXPECT_EQ(Drain(*p), (std::vector<uint32_t>{1, 2, 0}));
}

TEST_P(LeafFirstPolicy, HeldHandlesGoOnlyWhenAskedAndThenOldestFirst) {
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

TEST_P(LeafFirstPolicy, AVictimIsOfTheAskedClassAndOtherClassesAreNotAsked) {
  auto p = New();
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

TEST_P(LeafFirstPolicy, AnyClassPicksTheLeastRecentOfEachClassesPick) {
  auto p = New();
  p->OnInsert(0, kClass);
  p->OnInsert(1, 8192);
  p->OnInsert(2, kClass);
  p->OnAccess(0);
  EXPECT_EQ(Drain(*p, EvictionPolicy::kAnyClass), (std::vector<uint32_t>{1, 2, 0}));
}

TEST_P(LeafFirstPolicy, RemovedHandlesAreNeverPicked) {
  auto p = With({0, 1, 2, 3, 4});
  p->OnRemove(0);     // tail
  p->OnRemove(4);     // head
  p->OnRemove(2);     // middle
  p->OnUnblocked(2);  // ignored: not in the policy
  p->OnUnblocked(99);
  EXPECT_EQ(Drain(*p), (std::vector<uint32_t>{1, 3}));
}

TEST_P(LeafFirstPolicy, ASetAsideHandleCanBeRemoved) {
  auto p = With({0, 1});
  auto first_blocked = [](uint32_t h) { return h == 0 ? Verdict::kBlocked : Verdict::kEvict; };
  EXPECT_EQ(p->PickVictim(kClass, false, first_blocked), std::optional<uint32_t>(1));
  p->OnRemove(0);
  p->OnUnblocked(0);
  EXPECT_EQ(Drain(*p), (std::vector<uint32_t>{1}));
}

TEST_P(LeafFirstPolicy, ReusedHandleIsMostRecent) {
  auto p = With({0, 1, 2});
  p->OnRemove(0);
  p->OnInsert(0, kClass);  // the index reuses freed handles
  EXPECT_EQ(Drain(*p), (std::vector<uint32_t>{1, 2, 0}));
}

TEST_P(LeafFirstPolicy, SparseHandlesWork) {
  auto p = With({100, 7});
  p->OnAccess(100);
  EXPECT_EQ(Drain(*p), (std::vector<uint32_t>{7, 100}));
}

TEST_P(LeafFirstPolicy, SingleHandleRemoveAndReinsert) {
  auto p = With({0});
  p->OnRemove(0);
  EXPECT_FALSE(Pick(*p).has_value());
  p->OnInsert(0, kClass);
  EXPECT_EQ(Pick(*p), std::optional<uint32_t>(0));
}

// A chunk hit once outlives a run of chunks never hit after it: LRU drops it
// first (its hit came before they arrived); S3-FIFO moved it to main at its
// hit, so the small queue's unhit ones go first; ARC moved it to T2, and T1
// (over its target of 0) gives the victims first.
TEST(S3Fifo, AChunkHitOnceOutlivesAScanOfNewChunks) {
  for (const EvictionPolicyKind kind :
       {EvictionPolicyKind::kLru, EvictionPolicyKind::kS3Fifo, EvictionPolicyKind::kArc}) {
    auto p = NewEvictionPolicy(kind);
    p->OnInsert(0, kClass, 1000);
    p->OnAccess(0);
    for (uint32_t h = 1; h <= 9; ++h) p->OnInsert(h, kClass, 1000 + h);
    const std::vector<uint32_t> lru = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
    const std::vector<uint32_t> s3fifo = {1, 2, 3, 4, 5, 6, 7, 8, 9, 0};
    EXPECT_EQ(Drain(*p), kind == EvictionPolicyKind::kLru ? lru : s3fifo)
        << EvictionPolicyName(kind);
  }
}

// A chunk back soon after it left the small queue (its fingerprint is in the
// ghost FIFO) enters main, behind every chunk of the small queue; a new one
// (a fingerprint never seen) enters small, at its head.
TEST(S3Fifo, AChunkSeenAgainSoonEntersMain) {
  for (const uint64_t fingerprint : {uint64_t{1000}, uint64_t{5000}}) {
    auto p = NewS3FifoPolicy();
    for (uint32_t h = 0; h < 3; ++h) p->OnInsert(h, kClass, 1000 + h);
    ASSERT_EQ(Pick(*p), std::optional<uint32_t>(0));
    p->OnRemove(0);                       // fingerprint 1000 now a ghost
    p->OnInsert(0, kClass, fingerprint);  // handle 0 reused
    for (uint32_t h = 3; h < 6; ++h) p->OnInsert(h, kClass, 1000 + h);
    const std::vector<uint32_t> ghost = {1, 2, 3, 4, 5, 0};  // main goes last here
    const std::vector<uint32_t> fresh = {1, 2, 0, 3, 4, 5};  // FIFO order in small
    EXPECT_EQ(Drain(*p), fingerprint == 1000 ? ghost : fresh) << fingerprint;
  }
}

// In main a chunk with hits goes round again, one hit spent per round.
TEST(S3Fifo, MainGivesAChunkARoundPerHit) {
  auto p = NewS3FifoPolicy();
  p->OnInsert(0, kClass, 1000);
  p->OnInsert(1, kClass, 1001);
  p->OnAccess(0);
  p->OnAccess(1);
  // Both were hit in small: the search moves 0, then 1, to main (hits reset),
  // then offers main's tail, 0 (left in place: the caller keeps it).
  ASSERT_EQ(Pick(*p), std::optional<uint32_t>(0));
  for (int i = 0; i < 3; ++i) p->OnAccess(0);  // 0: 3 hits
  p->OnAccess(1);                              // 1: 1 hit
  // Main from tail: 0 (3) round, 1 (1) round, 0 (2) round, 1 (0) goes; then 0.
  EXPECT_EQ(Drain(*p), (std::vector<uint32_t>{1, 0}));
}

// A chunk back from B1 (it left T1 too soon) raises T1's target to 1 and
// enters T2. With 3 in T1 and 0 in T2: T1 gives victims while over 1 (1, 2),
// then T2 (0), then 3. Without the adaptation (target 0) T1 would empty first:
// 1, 2, 3, 0.
TEST(Arc, AChunkBackFromItsGhostRaisesTheTargetOfT1) {
  auto p = NewArcPolicy();
  for (uint32_t h = 0; h < 3; ++h) p->OnInsert(h, kClass, 1000 + h);
  ASSERT_EQ(Pick(*p), std::optional<uint32_t>(0));
  p->OnRemove(0);                // fingerprint 1000 into B1
  p->OnInsert(0, kClass, 1000);  // back: T2, target 1
  p->OnInsert(3, kClass, 1003);
  EXPECT_EQ(Drain(*p), (std::vector<uint32_t>{1, 2, 0, 3}));
}

}  // namespace
}  // namespace kvtier
