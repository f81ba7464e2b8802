// ReserveWrite's checks before it allocates (issue 10, item 11): a
// reservation that could never be committed evicts nothing, and a key held by
// another chunk is not reported as already stored.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <sstream>

#include "daemon/cache_core_harness.h"

namespace kvtier::testing {
namespace {

class CacheCoreReserveTest : public ::testing::Test, public CacheCoreDriver {
 protected:
  void SetUp() override { Start(Options(/*num_slots=*/3)); }
};

// It used to allocate first: the slots evicted good chunks, and the commit
// then dropped every chunk (its parent was not there).
TEST_F(CacheCoreReserveTest, NothingIsEvictedForAnOrphanReservation) {
  const auto a = Tokens(12);
  ASSERT_EQ(Store(a), 3u);
  v1::ReserveWriteResponse orphan;
  ASSERT_TRUE(
      wire::Run(*core_, ReserveRequest(Tokens(12, 100), session_, /*first_chunk=*/1), &orphan)
          .ok());
  EXPECT_EQ(orphan.reservation_id(), 0u);
  EXPECT_EQ(Lookup(a, false).num_chunks(), 3u) << "an orphan reservation evicted cached chunks";
  EXPECT_EQ(Stats().tiers(0).evictions(), 0u);
  ASSERT_EQ(orphan.outcomes_size(), 2);
  EXPECT_EQ(orphan.outcomes(0), v1::NO_PARENT);
  EXPECT_EQ(orphan.outcomes(1), v1::NO_PARENT);
  EXPECT_EQ(orphan.chunks_size(), 0);
}

TEST_F(CacheCoreReserveTest, AParentBeingWrittenIsEnough) {
  const auto b = Tokens(12, 100);
  const v1::ReserveWriteResponse first = Reserve(Tokens(4, 100));  // b's chunk 0, not committed
  ASSERT_NE(first.reservation_id(), 0u);
  WritePayloads(Tokens(4, 100), first);
  v1::ReserveWriteResponse rest;
  ASSERT_TRUE(wire::Run(*core_, ReserveRequest(b, session_, /*first_chunk=*/1), &rest).ok());
  ASSERT_EQ(rest.outcomes_size(), 2);
  EXPECT_EQ(rest.outcomes(0), v1::RESERVED);
  EXPECT_EQ(rest.outcomes(1), v1::RESERVED);
  ASSERT_TRUE(Commit(first.reservation_id()).ok());
  ASSERT_TRUE(Commit(rest.reservation_id()).ok());
  EXPECT_EQ(Lookup(b, false).num_chunks(), 3u);
}

// It used to answer ALREADY_STORED for a key held by a different chunk (other
// tokens, or another namespace, under the same 128-bit key): that prompt's
// chunk was then never stored.
TEST_F(CacheCoreReserveTest, AKeyHeldByAnotherChunkIsNotAlreadyStored) {
  const auto p = Tokens(12);
  const auto keys = Keys(p);
  ASSERT_EQ(Store(p), 3u);
  const v1::LookupResponse l = Lookup(p, true);
  ASSERT_EQ(l.chunks_size(), 3);
  ASSERT_TRUE(Release(l.lease_id()).ok());
  ForgeCollision(l.chunks(1).payload_offset(), keys[1], keys[0], {4, 5, 6, 8});
  const v1::ReserveWriteResponse r = Reserve(p);
  ASSERT_EQ(r.outcomes_size(), 3);
  EXPECT_EQ(r.outcomes(0), v1::ALREADY_STORED);
  EXPECT_EQ(r.outcomes(1), v1::KEY_TAKEN);
  EXPECT_EQ(r.outcomes(2), v1::KEY_TAKEN) << "its parent is not this prompt's chunk 1";
  EXPECT_EQ(r.reservation_id(), 0u);
}

// Issue 10, item 11: a client that kept looking up a colliding chunk wrote
// one warning per lookup into kvtierd's log. One per 10 s now, with a count.
TEST_F(CacheCoreReserveTest, RepeatedTokenCheckWarningsAreRateLimited) {
  const auto p = Tokens(4);
  ASSERT_EQ(Store(p), 1u);
  const v1::LookupResponse l = Lookup(p, true);
  ASSERT_EQ(l.chunks_size(), 1);
  ASSERT_TRUE(Release(l.lease_id()).ok());
  ForgeCollision(l.chunks(0).payload_offset(), Keys(p)[0], ns_, {100, 101, 102, 103});
  std::ostringstream captured;
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>(
      "captured", std::make_shared<spdlog::sinks::ostream_sink_mt>(captured)));
  for (int i = 0; i < 50; ++i) EXPECT_EQ(Lookup(p, true).num_chunks(), 0u);
  spdlog::set_default_logger(previous);
  const std::string log = captured.str();
  size_t lines = 0;
  for (size_t at = log.find("token check failed"); at != std::string::npos;
       at = log.find("token check failed", at + 1)) {
    ++lines;
  }
  EXPECT_EQ(lines, 1u) << log;
}

}  // namespace
}  // namespace kvtier::testing
