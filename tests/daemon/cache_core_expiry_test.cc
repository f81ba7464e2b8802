// CacheCore lifetimes: reservation and lease TTLs on a ManualClock, and
// EndSession reclaiming a session's leases and reservations.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include "daemon/cache_core_harness.h"
#include "kvtier/daemon/cache_core.h"
#include "kvtier/daemon/core_wire.h"

namespace kvtier::testing {
namespace {

using std::chrono::milliseconds;
using CacheCoreExpiryTest = CacheCoreHarness;

TEST_F(CacheCoreExpiryTest, ReservationExpiresAfterItsTtl) {
  const auto tokens = Tokens(12);
  const v1::ReserveWriteResponse r = Reserve(tokens);
  EXPECT_EQ(r.reservation_ttl_ms(), 2000u);
  ASSERT_EQ(UsedBytes(), 3 * kSlotBytes);
  WritePayloads(tokens, r);

  clock_.Advance(milliseconds(1999));
  core_->ExpireNow();
  EXPECT_EQ(UsedBytes(), 3 * kSlotBytes) << "expired before its TTL";
  EXPECT_EQ(Stats().active_reservations(), 1u);

  clock_.Advance(milliseconds(1));
  core_->ExpireNow();
  EXPECT_EQ(Stats().active_reservations(), 0u);
  EXPECT_EQ(Commit(r.reservation_id()).code(), StatusCode::kNotFound);
  EXPECT_EQ(Lookup(tokens, false).num_chunks(), 0u);
  // The writer's session is alive, so it may still be writing: its slots stay
  // out of use (never handed to another writer) until the session ends.
  EXPECT_EQ(UsedBytes(), 3 * kSlotBytes);
  EXPECT_EQ(Store(tokens), 3u);  // the keys are free again, in other slots
  EXPECT_EQ(UsedBytes(), 6 * kSlotBytes);
  core_->EndSession(session_);
  EXPECT_EQ(UsedBytes(), 3 * kSlotBytes) << "only the committed chunks stay";
}

TEST_F(CacheCoreExpiryTest, ReservationCommittedBeforeItsTtlStays) {
  const auto tokens = Tokens(8);
  const v1::ReserveWriteResponse r = Reserve(tokens);
  WritePayloads(tokens, r);
  clock_.Advance(milliseconds(1500));
  ASSERT_TRUE(Commit(r.reservation_id()).ok());
  clock_.Advance(milliseconds(10000));
  core_->ExpireNow();
  EXPECT_EQ(Lookup(tokens, false).num_chunks(), 2u);
  EXPECT_EQ(UsedBytes(), 2 * kSlotBytes);
}

TEST_F(CacheCoreExpiryTest, ExpiredReservationSlotsReturnWhenTheirSessionEnds) {
  Start(Options(/*num_slots=*/2));
  const uint64_t writer = core_->OpenSession("slow-writer", ExitedPid());
  ASSERT_EQ(Reserve(Tokens(8), writer).chunks_size(), 2);
  const v1::ReserveWriteResponse full = Reserve(Tokens(8, 100));
  EXPECT_EQ(full.reservation_id(), 0u);  // reserved slots are never evicted
  clock_.Advance(milliseconds(2000));
  core_->ExpireNow();
  // Expired, but the writer's session is alive: a late write could still land
  // in those slots, so no other writer gets them.
  EXPECT_EQ(Reserve(Tokens(8, 100)).reservation_id(), 0u);
  core_->EndSession(writer);
  EXPECT_EQ(Store(Tokens(8, 100)), 2u);
}

// Issue 32, item 4: a session whose stream broke while its client lives (the
// SDK's watchdog shut a socket that overran a deadline) ended and its
// reserved slots went to the next writer at once, while the client's storer
// was still copying into them: another session's chunk committed there was
// overwritten after sealing. The keys come back at once (another writer may
// store them, elsewhere), the slots only when the client process exits.
TEST_F(CacheCoreExpiryTest, ASessionEndedWhileItsClientRunsKeepsItsSlotsUntilTheClientExits) {
  Start(Options(/*num_slots=*/2));
  const pid_t client = fork();  // the writer's process: alive until killed
  if (client == 0) {
    pause();
    _exit(0);
  }
  ASSERT_GT(client, 0);
  const uint64_t writer = core_->OpenSession("writer", static_cast<uint32_t>(client));
  const auto tokens = Tokens(8);
  const v1::ReserveWriteResponse r = Reserve(tokens, writer);
  ASSERT_EQ(r.chunks_size(), 2);
  core_->EndSession(writer);  // its stream broke; its storer is still copying
  core_->ExpireNow();
  const v1::ReserveWriteResponse other = Reserve(Tokens(8, 100));
  EXPECT_EQ(other.reservation_id(), 0u)
      << "a slot the live writer may still be copying into went to another writer";
  EXPECT_EQ(UsedBytes(), 2 * kSlotBytes);
  // Its keys are free: the prompt is not "being written" by a session that is gone.
  const v1::ReserveWriteResponse again = Reserve(tokens);
  EXPECT_NE(again.outcomes(0), v1::BEING_WRITTEN);
  kill(client, SIGKILL);
  int status = 0;
  waitpid(client, &status, 0);
  core_->ExpireNow();  // the sweep finds the process gone
  EXPECT_EQ(UsedBytes(), 0u);
  EXPECT_EQ(Store(Tokens(8, 100)), 2u);
}

TEST_F(CacheCoreExpiryTest, LeaseExpiresAfterItsTtl) {
  const auto tokens = Tokens(8);
  ASSERT_EQ(Store(tokens), 2u);
  const v1::LookupResponse l = Lookup(tokens, true);
  EXPECT_EQ(l.lease_ttl_ms(), 1000u);
  ASSERT_EQ(Stats().active_leases(), 1u);

  clock_.Advance(milliseconds(999));
  core_->ExpireNow();
  EXPECT_EQ(Stats().active_leases(), 1u) << "expired before its TTL";

  clock_.Advance(milliseconds(1));
  core_->ExpireNow();
  EXPECT_EQ(Stats().active_leases(), 0u);
  EXPECT_EQ(Release(l.lease_id()).code(), StatusCode::kNotFound);
  EXPECT_EQ(Lookup(tokens, false).num_chunks(), 2u);  // the chunks stay cached
}

TEST_F(CacheCoreExpiryTest, ExpiredLeaseNoLongerPinsItsChunks) {
  Start(Options(/*num_slots=*/2));
  const auto tokens = Tokens(8);
  ASSERT_EQ(Store(tokens), 2u);
  ASSERT_NE(Lookup(tokens, true).lease_id(), 0u);
  EXPECT_EQ(Reserve(Tokens(8, 100)).reservation_id(), 0u);  // pinned: no space
  clock_.Advance(milliseconds(1000));
  core_->ExpireNow();
  EXPECT_EQ(Store(Tokens(8, 100)), 2u);
  EXPECT_EQ(Lookup(tokens, false).num_chunks(), 0u);
}

// A reader whose lease lapsed (past its TTL) while it was still copying must be
// able to tell: the slot's header sequence changes as soon as the slot is
// handed to a new writer, before that writer can touch the payload.
TEST_F(CacheCoreExpiryTest, SlotReusedAfterALapsedLeaseNoLongerShowsTheLeasedSequence) {
  Start(Options(/*num_slots=*/2));
  const auto tokens = Tokens(8);
  ASSERT_EQ(Store(tokens), 2u);
  const v1::LookupResponse lease = Lookup(tokens, true);
  ASSERT_EQ(lease.chunks_size(), 2);
  const auto slot_of = [&](int i) {
    return client_arena_->base() + lease.chunks(i).payload_offset() - kHeaderBytes;
  };
  for (int i = 0; i < 2; ++i) {
    ASSERT_NE(lease.chunks(i).sequence(), 0u);
    EXPECT_EQ(SlotSequence(slot_of(i)), lease.chunks(i).sequence()) << "chunk " << i;
  }
  clock_.Advance(milliseconds(1000));
  core_->ExpireNow();
  const v1::ReserveWriteResponse r = Reserve(Tokens(8, 100));  // evicts both, reuses the slots
  ASSERT_EQ(r.chunks_size(), 2);
  for (int i = 0; i < 2; ++i) {
    EXPECT_NE(SlotSequence(slot_of(i)), lease.chunks(i).sequence()) << "chunk " << i;
  }
  WritePayloads(Tokens(8, 100), r);
  ASSERT_TRUE(Commit(r.reservation_id()).ok());
  for (int i = 0; i < 2; ++i) {
    EXPECT_NE(SlotSequence(slot_of(i)), lease.chunks(i).sequence()) << "chunk " << i;
  }
}

TEST_F(CacheCoreExpiryTest, EachLeaseHasItsOwnExpiry) {
  const auto tokens = Tokens(4);
  ASSERT_EQ(Store(tokens), 1u);
  const uint64_t first = Lookup(tokens, true).lease_id();
  clock_.Advance(milliseconds(600));
  const uint64_t second = Lookup(tokens, true).lease_id();
  ASSERT_NE(first, second);
  clock_.Advance(milliseconds(400));
  core_->ExpireNow();
  EXPECT_EQ(Release(first).code(), StatusCode::kNotFound);
  EXPECT_TRUE(Release(second).ok());
}

TEST_F(CacheCoreExpiryTest, EndSessionFreesItsLeasesAndReservations) {
  const auto stored = Tokens(8);
  ASSERT_EQ(Store(stored), 2u);
  const uint64_t other = core_->OpenSession("other", ExitedPid());
  const uint64_t other_lease = Lookup(stored, true, other).lease_id();
  ASSERT_NE(other_lease, 0u);
  const v1::ReserveWriteResponse other_res = Reserve(Tokens(8, 100), other);
  ASSERT_NE(other_res.reservation_id(), 0u);
  const uint64_t my_lease = Lookup(stored, true).lease_id();
  const v1::ReserveWriteResponse my_res = Reserve(Tokens(4, 200));
  ASSERT_EQ(Stats().active_leases(), 2u);
  ASSERT_EQ(Stats().active_reservations(), 2u);
  ASSERT_EQ(UsedBytes(), 5 * kSlotBytes);
  ASSERT_EQ(Stats().sessions(), 2u);

  core_->EndSession(other);
  const v1::StatsResponse s = Stats();
  EXPECT_EQ(s.sessions(), 1u);
  EXPECT_EQ(s.active_leases(), 1u);
  EXPECT_EQ(s.active_reservations(), 1u);
  EXPECT_EQ(UsedBytes(), 3 * kSlotBytes);
  // The ended session is gone: its ids are unusable, even by itself.
  EXPECT_EQ(Release(other_lease, other).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(Commit(other_res.reservation_id(), nullptr, other).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(Commit(other_res.reservation_id()).code(), StatusCode::kNotFound);
  // This session's lease and reservation are untouched.
  EXPECT_TRUE(Release(my_lease).ok());
  EXPECT_TRUE(Commit(my_res.reservation_id()).ok());
  core_->EndSession(other);  // ending twice is harmless
  EXPECT_EQ(Stats().sessions(), 1u);
}

TEST_F(CacheCoreExpiryTest, EndedSessionCannotStartNewWork) {
  const uint64_t other = core_->OpenSession("other", ExitedPid());
  core_->EndSession(other);
  v1::ReserveWriteResponse resp;
  EXPECT_EQ(wire::Run(*core_, ReserveRequest(Tokens(4), other), &resp).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(UsedBytes(), 0u);
}

// Lookup hashes the prompt between two critical sections. A session that ends
// in between must not be left holding a lease (EndSession already ran, so only
// the TTL would free it). The prompt is long so that EndSession lands inside
// that window; if it lands elsewhere the test passes trivially.
TEST_F(CacheCoreExpiryTest, EndSessionDuringALookupLeavesNoLease) {
  ASSERT_EQ(Store(Tokens(4)), 1u);
  const auto prompt = Tokens(core_->options().max_prompt_tokens);  // 4 Mi tokens, 1 Mi chunks
  // Calibrate: how long one such lookup takes here; EndSession lands inside it.
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(Lookup(prompt, false).num_chunks(), 1u);
  const auto one_lookup = std::chrono::steady_clock::now() - t0;
  for (int divisor : {2, 3, 5}) {  // a few landing points, in case timing is off
    const uint64_t other = core_->OpenSession("other", ExitedPid());
    std::thread lookup([&] {
      v1::LookupRequest req;
      req.set_session_id(other);
      req.set_epoch(kEpoch);
      req.set_namespace_id(ns_wire_);
      req.set_tokens(PackTokens(prompt));
      req.set_acquire(true);
      v1::LookupResponse resp;
      (void)wire::Run(*core_, req, &resp);
    });
    std::this_thread::sleep_for(one_lookup / divisor);
    core_->EndSession(other);
    lookup.join();
    ASSERT_EQ(Stats().active_leases(), 0u)
        << "a lease was granted to session " << other << " after it had ended (EndSession at "
        << "1/" << divisor << " of a "
        << std::chrono::duration_cast<milliseconds>(one_lookup).count() << " ms lookup)";
  }
}

}  // namespace
}  // namespace kvtier::testing
