// Per-session limits (issue 10, item 12): one client's reservations, leases
// and expired reservations cannot take every DRAM slot from the others.
//
// The arena holds 16 tiny slots; session_max_bytes is its default, half the
// arena (8 slots). `greedy_` reserves and leases and never gives anything back;
// `polite_` (the harness's own session) stores and loads one prompt at a time.
#include <gtest/gtest.h>

#include "daemon/cache_core_harness.h"

namespace kvtier::testing {
namespace {

class CacheCoreFairnessTest : public ::testing::Test, public CacheCoreDriver {
 protected:
  void SetUp() override {
    CacheCoreOptions o = Options(/*num_slots=*/16);
    o.session_max_bytes = 0;  // the default: half the arena
    Start(o);
    greedy_ = core_->OpenSession("greedy", ExitedPid());
  }

  // The polite client's store and load of a fresh 4-chunk prompt, with every
  // leased byte checked; returns how many chunks came back.
  size_t PoliteRoundTrip(int32_t first_token) {
    const auto p = Tokens(16, first_token);
    if (Store(p) != 4) return 0;
    const v1::LookupResponse l = Lookup(p, /*acquire=*/true);
    EXPECT_TRUE(LeasedBytesMatch(p, l));
    if (l.lease_id() != 0) {
      EXPECT_TRUE(Release(l.lease_id()).ok());
    }
    return l.chunks_size();
  }

  size_t Count(const v1::ReserveWriteResponse& r, v1::ReserveOutcome outcome) const {
    size_t n = 0;
    for (int i = 0; i < r.outcomes_size(); ++i) n += r.outcomes(i) == outcome ? 1 : 0;
    return n;
  }

  uint64_t greedy_ = 0;
};

// Without the limit the greedy client's two reservations took all 16 slots and
// the polite client's store got NO_SPACE for every chunk.
TEST_F(CacheCoreFairnessTest, OpenReservationsStopAtTheSessionLimit) {
  const v1::ReserveWriteResponse first = Reserve(Tokens(48, 1000), greedy_);  // 12 chunks
  EXPECT_EQ(Count(first, v1::RESERVED), 8u);
  EXPECT_EQ(Count(first, v1::SESSION_LIMIT), 4u);
  ASSERT_EQ(first.outcomes_size(), 12);
  EXPECT_EQ(first.outcomes(8), v1::SESSION_LIMIT) << "the chunks past the limit are the last";
  const v1::ReserveWriteResponse second = Reserve(Tokens(16, 2000), greedy_);
  EXPECT_EQ(second.reservation_id(), 0u);
  EXPECT_EQ(Count(second, v1::SESSION_LIMIT), 4u);
  EXPECT_EQ(Stats().session_limited(), 2u);

  EXPECT_EQ(PoliteRoundTrip(0), 4u);
  EXPECT_EQ(PoliteRoundTrip(100), 4u) << "the polite client keeps its share";
}

// Without the limit the greedy client's leases pinned all 16 slots and the
// polite client could store nothing.
TEST_F(CacheCoreFairnessTest, LeasesStopAtTheSessionLimit) {
  const auto x = Tokens(48, 1000);  // 12 chunks, stored by the polite client in two parts
  ASSERT_EQ(Store(std::vector<int32_t>(x.begin(), x.begin() + 32)), 8u);
  const v1::ReserveWriteResponse rest = [&] {
    v1::ReserveWriteResponse r;
    EXPECT_TRUE(wire::Run(*core_, ReserveRequest(x, session_, /*first_chunk=*/8), &r).ok());
    return r;
  }();
  ASSERT_EQ(Count(rest, v1::RESERVED), 4u);
  v1::ReserveWriteResponse shifted = rest;  // WritePayloads indexes outcomes from chunk 0
  shifted.clear_outcomes();
  for (int i = 0; i < 8; ++i) shifted.add_outcomes(v1::ALREADY_STORED);
  for (int i = 0; i < rest.outcomes_size(); ++i) shifted.add_outcomes(rest.outcomes(i));
  WritePayloads(x, shifted);
  ASSERT_TRUE(Commit(rest.reservation_id()).ok());
  const auto y = Tokens(16, 2000);
  ASSERT_EQ(Store(y), 4u);

  const v1::LookupResponse lx = Lookup(x, true, greedy_);
  EXPECT_EQ(lx.chunks_size(), 8) << "a lease of a shorter prefix, within the limit";
  EXPECT_TRUE(LeasedBytesMatch(x, lx));
  const v1::LookupResponse ly = Lookup(y, true, greedy_);
  EXPECT_EQ(ly.chunks_size(), 0);
  EXPECT_EQ(ly.lease_id(), 0u);
  EXPECT_EQ(Stats().session_limited(), 2u);
  EXPECT_EQ(Lookup(y, false, greedy_).num_chunks(), 4u) << "a lookup without a lease is not cut";

  EXPECT_EQ(PoliteRoundTrip(0), 4u);
  EXPECT_EQ(PoliteRoundTrip(100), 4u);
  // A released lease gives the room back (x's first 8 chunks stayed: they were pinned).
  ASSERT_TRUE(Release(lx.lease_id(), greedy_).ok());
  EXPECT_EQ(Lookup(x, true, greedy_).chunks_size(), 8);
}

// A hung client's reservations expire but stay held while its session lives
// (it may still be writing them). Before, it could then reserve a fresh set,
// and again after each expiry, until the arena was gone.
TEST_F(CacheCoreFairnessTest, ExpiredReservationsOfAHungClientStillCount) {
  const v1::ReserveWriteResponse first = Reserve(Tokens(32, 1000), greedy_);
  ASSERT_EQ(Count(first, v1::RESERVED), 8u);
  clock_.Advance(std::chrono::milliseconds(2500));  // past reservation_ttl
  core_->ExpireNow();
  EXPECT_EQ(Stats().active_reservations(), 0u);
  const v1::ReserveWriteResponse again = Reserve(Tokens(32, 3000), greedy_);
  EXPECT_EQ(Count(again, v1::RESERVED), 0u);
  EXPECT_EQ(Count(again, v1::SESSION_LIMIT), 8u);
  EXPECT_EQ(PoliteRoundTrip(0), 4u);
  EXPECT_EQ(PoliteRoundTrip(100), 4u);

  core_->EndSession(greedy_);  // the slots come back with the session
  EXPECT_EQ(Stats().tiers(0).uncommitted_bytes(), 0u);
}

// A limit below one slot still lets a session that holds nothing take a
// chunk, so a tiny arena keeps working one chunk at a time.
TEST(CacheCoreSessionLimit, ASessionHoldingNothingMayTakeOneChunk) {
  CacheCoreDriver d;
  CacheCoreOptions o = CacheCoreDriver::Options(4);
  o.session_max_bytes = 100;
  d.Start(o);
  const v1::ReserveWriteResponse r = d.Reserve(Tokens(8));
  ASSERT_EQ(r.outcomes_size(), 2);
  EXPECT_EQ(r.outcomes(0), v1::RESERVED);
  EXPECT_EQ(r.outcomes(1), v1::SESSION_LIMIT);
}

}  // namespace
}  // namespace kvtier::testing
