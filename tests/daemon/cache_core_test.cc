// CacheCore: the store / load path, the token check, ownership of leases and
// reservations, and eviction under leases. TTLs and sessions: cache_core_expiry_test.cc.
#include "kvtier/daemon/cache_core.h"

#include <gtest/gtest.h>

#include "daemon/cache_core_harness.h"
#include "kvtier/daemon/core_wire.h"

namespace kvtier::testing {
namespace {

using CacheCoreTest = CacheCoreHarness;

TEST_F(CacheCoreTest, OpenNamespaceReportsTheTinyLayoutAndIsIdempotent) {
  v1::OpenNamespaceRequest req;
  req.set_session_id(session_);
  *req.mutable_spec() = TinyProtoSpec();
  v1::OpenNamespaceResponse resp;
  ASSERT_TRUE(wire::Run(*core_, req, &resp).ok());
  EXPECT_EQ(resp.namespace_id(), ns_.ToBytes());
  EXPECT_EQ(resp.payload_bytes(), kPayloadBytes);
  EXPECT_EQ(resp.header_bytes(), kHeaderBytes);
  EXPECT_EQ(resp.slot_bytes(), kSlotBytes);
  v1::NamespacesResponse all;
  wire::Run(*core_, &all);
  ASSERT_EQ(all.namespaces_size(), 1);
  EXPECT_EQ(all.namespaces(0).spec().model_id(), "test-model");
}

TEST_F(CacheCoreTest, StoredChunksLoadWithTheSameBytes) {
  const auto tokens = Tokens(12);
  const v1::ReserveWriteResponse r = Reserve(tokens);
  ASSERT_EQ(r.outcomes_size(), 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(r.outcomes(i), v1::RESERVED) << i;
  ASSERT_EQ(r.chunks_size(), 3);
  ASSERT_NE(r.reservation_id(), 0u);
  EXPECT_EQ(r.chunks(0).payload_offset() % kSlotBytes, kHeaderBytes);
  WritePayloads(tokens, r);
  v1::CommitWriteResponse c;
  ASSERT_TRUE(Commit(r.reservation_id(), &c).ok());
  EXPECT_EQ(c.committed_chunks(), 3u);
  EXPECT_EQ(c.dropped_chunks(), 0u);

  const v1::LookupResponse l = Lookup(tokens, /*acquire=*/true);
  EXPECT_EQ(l.num_chunks(), 3u);
  EXPECT_EQ(l.cached_tokens(), 12u);
  EXPECT_NE(l.lease_id(), 0u);
  ASSERT_EQ(l.chunks_size(), 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(l.chunks(i).payload_offset(), r.chunks(i).payload_offset());
  EXPECT_TRUE(LeasedBytesMatch(tokens, l));
  EXPECT_TRUE(Release(l.lease_id()).ok());
}

TEST_F(CacheCoreTest, CommitSealsAVerifiableSlotHeader) {
  const auto tokens = Tokens(8);
  ASSERT_EQ(Store(tokens), 2u);
  const v1::LookupResponse l = Lookup(tokens, true);
  ASSERT_EQ(l.chunks_size(), 2);
  const auto keys = ComputeChunkKeys(ns_, tokens, kChunkTokens);
  const SlotLayout layout = SlotLayout::For(TinySpec());
  const std::byte* slot = client_arena_->base() + l.chunks(1).payload_offset() - kHeaderBytes;
  const SlotIdentity id{ns_, keys[1], keys[0], std::span(tokens).subspan(4, 4)};
  EXPECT_TRUE(VerifySlotHeader(slot, layout, id).ok());
  // Commit leaves the payload checksum to the NVMe writer: pending until sealed.
  EXPECT_EQ(VerifySlotPayload(slot, layout).code(), StatusCode::kDataLoss);
  std::vector<std::byte> copy(slot, slot + layout.slot_bytes);
  SealPayloadChecksum(copy.data(), layout);
  EXPECT_TRUE(VerifySlotHeader(copy.data(), layout, id).ok());
  EXPECT_TRUE(VerifySlotPayload(copy.data(), layout).ok());
  copy[layout.header_bytes + 5] ^= std::byte{1};
  EXPECT_EQ(VerifySlotPayload(copy.data(), layout).code(), StatusCode::kDataLoss);
}

TEST_F(CacheCoreTest, LookupWithoutAcquireLeasesNothing) {
  const auto tokens = Tokens(8);
  ASSERT_EQ(Store(tokens), 2u);
  const v1::LookupResponse l = Lookup(tokens, /*acquire=*/false);
  EXPECT_EQ(l.num_chunks(), 2u);
  EXPECT_EQ(l.lease_id(), 0u);
  EXPECT_EQ(l.chunks_size(), 0);
  EXPECT_EQ(Stats().active_leases(), 0u);
}

TEST_F(CacheCoreTest, UncommittedWriteIsInvisible) {
  const auto tokens = Tokens(8);
  const v1::ReserveWriteResponse r = Reserve(tokens);
  WritePayloads(tokens, r);
  const v1::LookupResponse l = Lookup(tokens, true);
  EXPECT_EQ(l.num_chunks(), 0u);
  EXPECT_EQ(l.lease_id(), 0u);
  EXPECT_EQ(Stats().tiers(0).chunks(), 0u);
  EXPECT_EQ(UsedBytes(), 2 * kSlotBytes);  // reserved, not visible
}

TEST_F(CacheCoreTest, ChunksBeingWrittenByAnotherClientAreNotReservedTwice) {
  const auto tokens = Tokens(8);
  const v1::ReserveWriteResponse first = Reserve(tokens);
  const uint64_t other = core_->OpenSession("other", ExitedPid());
  const v1::ReserveWriteResponse second = Reserve(tokens, other);
  ASSERT_EQ(second.outcomes_size(), 2);
  EXPECT_EQ(second.outcomes(0), v1::BEING_WRITTEN);
  EXPECT_EQ(second.outcomes(1), v1::BEING_WRITTEN);
  EXPECT_EQ(second.reservation_id(), 0u);
  EXPECT_EQ(UsedBytes(), 2 * kSlotBytes);
}

TEST_F(CacheCoreTest, AbortWriteFreesTheSlots) {
  const auto tokens = Tokens(12);
  const v1::ReserveWriteResponse r = Reserve(tokens);
  ASSERT_EQ(UsedBytes(), 3 * kSlotBytes);
  v1::AbortWriteRequest abort;
  abort.set_session_id(session_);
  abort.set_reservation_id(r.reservation_id());
  ASSERT_TRUE(wire::Run(*core_, abort).ok());
  EXPECT_EQ(UsedBytes(), 0u);
  EXPECT_EQ(Stats().active_reservations(), 0u);
  EXPECT_EQ(Commit(r.reservation_id()).code(), StatusCode::kNotFound);
  EXPECT_EQ(Lookup(tokens, false).num_chunks(), 0u);
  EXPECT_EQ(Store(tokens), 3u);  // the keys are free to be written again
}

TEST_F(CacheCoreTest, ExtendingAPrefixReservesOnlyTheNewChunks) {
  ASSERT_EQ(Store(Tokens(8)), 2u);
  const auto longer = Tokens(16);
  const v1::ReserveWriteResponse r = Reserve(longer);
  ASSERT_EQ(r.outcomes_size(), 4);
  EXPECT_EQ(r.outcomes(0), v1::ALREADY_STORED);
  EXPECT_EQ(r.outcomes(1), v1::ALREADY_STORED);
  EXPECT_EQ(r.outcomes(2), v1::RESERVED);
  EXPECT_EQ(r.outcomes(3), v1::RESERVED);
  EXPECT_EQ(r.chunks_size(), 2);
  WritePayloads(longer, r);
  ASSERT_TRUE(Commit(r.reservation_id()).ok());
  const v1::LookupResponse l = Lookup(longer, true);
  EXPECT_EQ(l.num_chunks(), 4u);
  EXPECT_TRUE(LeasedBytesMatch(longer, l));
}

TEST_F(CacheCoreTest, LookupLongerThanTheCacheReturnsTheLongestLeadingRun) {
  ASSERT_EQ(Store(Tokens(8)), 2u);
  auto prompt = Tokens(23);  // 5 full chunks + a 3-token tail; the first 2 are cached
  const v1::LookupResponse l = Lookup(prompt, true);
  EXPECT_EQ(l.num_chunks(), 2u);
  EXPECT_EQ(l.cached_tokens(), 8u);
  EXPECT_EQ(l.chunks_size(), 2);
  EXPECT_TRUE(LeasedBytesMatch(prompt, l));
  prompt[0] = 999;  // a different first chunk: nothing after it can match
  EXPECT_EQ(Lookup(prompt, false).num_chunks(), 0u);
  const v1::StatsResponse s = Stats();
  EXPECT_EQ(s.lookups(), 2u);
  EXPECT_EQ(s.lookup_tokens(), 46u);
  EXPECT_EQ(s.hit_tokens(), 8u);
  EXPECT_EQ(s.tiers(0).hits(), 2u);
  EXPECT_EQ(s.tiers(0).misses(), 8u);  // 3 + 5 full chunks not hit
}

TEST_F(CacheCoreTest, PartialTailIsNeverStoredNorHit) {
  const auto tokens = Tokens(7);  // 1 chunk + 3 tail tokens
  const v1::ReserveWriteResponse r = Reserve(tokens);
  EXPECT_EQ(r.outcomes_size(), 1);
  WritePayloads(tokens, r);
  ASSERT_TRUE(Commit(r.reservation_id()).ok());
  EXPECT_EQ(Lookup(tokens, false).cached_tokens(), 4u);
  EXPECT_EQ(Lookup(Tokens(3), false).num_chunks(), 0u);
}

// ---- Token check: a key collision is a miss, never another prompt's KV. ----

TEST_F(CacheCoreTest, CollidingKeyWithOtherTokensIsAMiss) {
  const auto tokens = Tokens(4);
  ASSERT_EQ(Store(tokens), 1u);
  const auto keys = ComputeChunkKeys(ns_, tokens, kChunkTokens);
  v1::LookupResponse l = Lookup(tokens, true);
  ASSERT_EQ(l.chunks_size(), 1);
  ASSERT_TRUE(Release(l.lease_id()).ok());
  ForgeCollision(l.chunks(0).payload_offset(), keys[0], ns_, {100, 101, 102, 103});
  const v1::LookupResponse miss = Lookup(tokens, true);
  EXPECT_EQ(miss.num_chunks(), 0u);
  EXPECT_EQ(miss.cached_tokens(), 0u);
  EXPECT_EQ(miss.lease_id(), 0u);
  EXPECT_EQ(miss.chunks_size(), 0);
  EXPECT_EQ(Stats().active_leases(), 0u);
}

TEST_F(CacheCoreTest, CollisionInALaterChunkCutsThePrefixThere) {
  const auto tokens = Tokens(12);
  ASSERT_EQ(Store(tokens), 3u);
  const auto keys = ComputeChunkKeys(ns_, tokens, kChunkTokens);
  v1::LookupResponse l = Lookup(tokens, true);
  ASSERT_EQ(l.chunks_size(), 3);
  ASSERT_TRUE(Release(l.lease_id()).ok());
  ForgeCollision(l.chunks(1).payload_offset(), keys[1], keys[0], {4, 5, 6, 8});
  const v1::LookupResponse cut = Lookup(tokens, true);
  EXPECT_EQ(cut.num_chunks(), 1u);
  EXPECT_EQ(cut.chunks_size(), 1);
  EXPECT_TRUE(LeasedBytesMatch(tokens, cut));
}

// A Lookup leaves only its lease's pins behind, whether the token check passes
// or cuts the prefix (a guard for any change that pins chunks while checking).
TEST_F(CacheCoreTest, ALookupsTokenCheckLeavesOnlyItsLeasesPins) {
  const auto tokens = Tokens(12);
  ASSERT_EQ(Store(tokens), 3u);
  const auto keys = ComputeChunkKeys(ns_, tokens, kChunkTokens);
  auto dram_pinned = [&] {
    const v1::StatsResponse stats = Stats();
    for (const v1::TierStats& t : stats.tiers()) {
      if (t.name() == "dram") return t.pinned_chunks();
    }
    ADD_FAILURE() << "no dram tier in the stats";
    return uint64_t{0};
  };
  EXPECT_EQ(Lookup(tokens, false).num_chunks(), 3u);
  EXPECT_EQ(dram_pinned(), 0u);
  v1::LookupResponse l = Lookup(tokens, true);
  ASSERT_EQ(l.chunks_size(), 3);
  EXPECT_EQ(dram_pinned(), 3u);
  ASSERT_TRUE(Release(l.lease_id()).ok());
  EXPECT_EQ(dram_pinned(), 0u);
  ForgeCollision(l.chunks(1).payload_offset(), keys[1], keys[0], {4, 5, 6, 8});
  EXPECT_EQ(Lookup(tokens, false).num_chunks(), 1u);
  EXPECT_EQ(dram_pinned(), 0u);
  const v1::LookupResponse cut = Lookup(tokens, true);
  EXPECT_EQ(cut.chunks_size(), 1);
  EXPECT_EQ(dram_pinned(), 1u);
  ASSERT_TRUE(Release(cut.lease_id()).ok());
  EXPECT_EQ(dram_pinned(), 0u);
}

TEST_F(CacheCoreTest, CorruptedHeaderTokenIdIsAMiss) {
  const auto tokens = Tokens(4);
  ASSERT_EQ(Store(tokens), 1u);
  const v1::LookupResponse leased = Lookup(tokens, true);
  ASSERT_TRUE(Release(leased.lease_id()).ok());
  std::byte* slot = client_arena_->base() + leased.chunks(0).payload_offset() - kHeaderBytes;
  slot[sizeof(SlotHeader) + 2 * 4] ^= std::byte{1};  // token id 2 of the header
  EXPECT_EQ(Lookup(tokens, true).num_chunks(), 0u);
}

// ---- Ownership ----

TEST_F(CacheCoreTest, ForeignLeaseAndReservationArePermissionDenied) {
  const auto tokens = Tokens(8);
  ASSERT_EQ(Store(tokens), 2u);
  const v1::LookupResponse l = Lookup(tokens, true);
  const v1::ReserveWriteResponse r = Reserve(Tokens(4, 1000));
  const uint64_t other = core_->OpenSession("other", ExitedPid());
  EXPECT_EQ(Release(l.lease_id(), other).code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(Commit(r.reservation_id(), nullptr, other).code(), StatusCode::kPermissionDenied);
  v1::AbortWriteRequest abort;
  abort.set_session_id(other);
  abort.set_reservation_id(r.reservation_id());
  EXPECT_EQ(wire::Run(*core_, abort).code(), StatusCode::kPermissionDenied);
  // The owner still holds both.
  EXPECT_TRUE(Release(l.lease_id()).ok());
  EXPECT_TRUE(Commit(r.reservation_id()).ok());
}

// A chunk written in namespace B under a parent that belongs to namespace A is
// unreachable in B (B's chains start at B's id) and must not occupy A's key:
// otherwise A's ReserveWrite says ALREADY_STORED while A's Lookup fails the
// token check on it, so A can never cache that chunk.
TEST_F(CacheCoreTest, ChunkGraftedFromAnotherNamespaceDoesNotBlockThisOne) {
  const auto prompt = Tokens(12);  // a0 <- a1 <- a2 in this namespace
  ASSERT_EQ(Store(Tokens(8)), 2u);
  const auto keys = ComputeChunkKeys(ns_, prompt, kChunkTokens);
  v1::OpenNamespaceRequest open;
  open.set_session_id(session_);
  *open.mutable_spec() = TinyProtoSpec();
  open.mutable_spec()->set_cache_salt("tenant-b");
  v1::OpenNamespaceResponse b;
  ASSERT_TRUE(wire::Run(*core_, open, &b).ok());
  v1::ReserveWriteRequest graft;
  graft.set_session_id(session_);
  graft.set_epoch(kEpoch);
  graft.set_namespace_id(b.namespace_id());
  auto* c = graft.add_chunks();
  c->set_key(keys[2].ToBytes());
  c->set_parent_key(keys[1].ToBytes());
  c->set_tokens(PackTokens(std::span(prompt).subspan(8, 4)));
  v1::ReserveWriteResponse r;
  if (wire::Run(*core_, graft, &r).ok() && r.reservation_id() != 0) {
    ASSERT_TRUE(Commit(r.reservation_id()).ok());
  }
  Store(prompt);  // this namespace stores its own third chunk
  EXPECT_EQ(Lookup(prompt, false).num_chunks(), 3u)
      << "namespace B's grafted chunk holds this namespace's key";
}

// ---- Eviction ----

TEST_F(CacheCoreTest, LeasedChunksSurviveEvictionPressure) {
  Start(Options(/*num_slots=*/6));
  const auto leased = Tokens(8, 0);
  ASSERT_EQ(Store(leased), 2u);
  const v1::LookupResponse l = Lookup(leased, true);
  ASSERT_EQ(l.num_chunks(), 2u);
  for (int32_t p = 1; p <= 20; ++p) EXPECT_EQ(Store(Tokens(8, p * 1000)), 2u) << p;
  EXPECT_GT(Stats().tiers(0).evictions(), 0u);
  EXPECT_EQ(Lookup(leased, false).num_chunks(), 2u);
  EXPECT_TRUE(LeasedBytesMatch(leased, l));  // nobody reused the leased slots
  ASSERT_TRUE(Release(l.lease_id()).ok());
  for (int32_t p = 21; p <= 24; ++p) Store(Tokens(8, p * 1000));
  EXPECT_EQ(Lookup(leased, false).num_chunks(), 0u);  // evictable once released
}

TEST_F(CacheCoreTest, EverythingLeasedMeansNoSpace) {
  Start(Options(/*num_slots=*/2));
  const auto tokens = Tokens(8);
  ASSERT_EQ(Store(tokens), 2u);
  const uint64_t reader = core_->OpenSession("reader", ExitedPid());  // not the writer's own limit
  const v1::LookupResponse l = Lookup(tokens, true, reader);
  const v1::ReserveWriteResponse r = Reserve(Tokens(8, 500));
  ASSERT_EQ(r.outcomes_size(), 2);
  EXPECT_EQ(r.outcomes(0), v1::NO_SPACE);
  EXPECT_EQ(r.outcomes(1), v1::NO_SPACE);
  EXPECT_EQ(r.reservation_id(), 0u);
  EXPECT_EQ(Lookup(tokens, false).num_chunks(), 2u);
  EXPECT_TRUE(Release(l.lease_id(), reader).ok());
}

// A ReserveWrite must not evict the resident parent of its own first chunk:
// the chunk would then be dropped at commit and the parent lost for nothing.
TEST_F(CacheCoreTest, ReserveWriteNeverEvictsItsOwnParent) {
  Start(Options(/*num_slots=*/2));
  ASSERT_EQ(Store(Tokens(8)), 2u);  // c0 <- c1 fill the arena
  const auto longer = Tokens(12);   // c0 <- c1 <- c2
  const v1::ReserveWriteResponse r = Reserve(longer);
  ASSERT_EQ(r.outcomes_size(), 3);
  if (r.outcomes(2) == v1::RESERVED) {
    WritePayloads(longer, r);
    v1::CommitWriteResponse c;
    ASSERT_TRUE(Commit(r.reservation_id(), &c).ok());
    EXPECT_EQ(c.dropped_chunks(), 0u) << "the reservation evicted its own parent c1";
  }
  EXPECT_GE(Lookup(longer, false).num_chunks(), 2u) << "c1 was evicted to make room for c2";
}

}  // namespace
}  // namespace kvtier::testing

namespace kvtier::testing {
namespace {

// At the namespace limit, an idle namespace (no resident chunk, no pending
// write) makes room for a new one; busy ones are never taken.
TEST_F(CacheCoreHarness, IdleNamespaceMakesRoomAtTheLimitBusyOnesDoNot) {
  CacheCoreOptions o = Options(/*num_slots=*/8);
  o.max_namespaces = 2;
  Start(o);  // the harness namespace (tiny, salt "") is #1
  const auto open = [&](const std::string& salt) {
    v1::OpenNamespaceRequest req;
    req.set_session_id(session_);
    *req.mutable_spec() = TinyProtoSpec();
    req.mutable_spec()->set_cache_salt(salt);
    v1::OpenNamespaceResponse resp;
    return wire::Run(*core_, req, &resp);
  };
  const auto count = [&] {
    v1::NamespacesResponse r;
    wire::Run(*core_, &r);
    return r.namespaces_size();
  };
  ASSERT_EQ(Store(Tokens(8)), 2u);     // #1 holds chunks
  ASSERT_TRUE(open("tenant-b").ok());  // #2, idle
  EXPECT_TRUE(open("tenant-c").ok());  // takes #2's place
  EXPECT_EQ(count(), 2);
  // A pending write keeps a namespace busy: reserve in the harness namespace's
  // place is not possible, so make tenant-c busy through a reservation.
  NamespaceSpec c = TinySpec();
  c.cache_salt = "tenant-c";
  const NamespaceId c_id = c.Digest();
  v1::ReserveWriteRequest req;
  req.set_session_id(session_);
  req.set_epoch(kEpoch);
  req.set_namespace_id(c_id.ToBytes());
  const auto tokens = Tokens(4, 500);
  auto* chunk = req.add_chunks();
  chunk->set_key(ComputeChunkKey(c_id, tokens).ToBytes());
  chunk->set_parent_key(c_id.ToBytes());
  chunk->set_tokens(PackTokens(tokens));
  v1::ReserveWriteResponse resp;
  ASSERT_TRUE(wire::Run(*core_, req, &resp).ok());
  ASSERT_NE(resp.reservation_id(), 0u);
  const Status refused = open("tenant-d");
  EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted) << refused.ToString();
  EXPECT_EQ(count(), 2);
  // The harness namespace still serves its chunks.
  EXPECT_EQ(Lookup(Tokens(8), false).num_chunks(), 2u);
  v1::AbortWriteRequest abort;
  abort.set_session_id(session_);
  abort.set_reservation_id(resp.reservation_id());
  ASSERT_TRUE(wire::Run(*core_, abort).ok());
  EXPECT_TRUE(open("tenant-d").ok()) << "tenant-c is idle again";
  // The replaced namespace is unknown now: a clear NOT_FOUND, not another's KV.
  v1::LookupRequest lookup;
  lookup.set_session_id(session_);
  lookup.set_epoch(kEpoch);
  lookup.set_namespace_id(c_id.ToBytes());
  lookup.set_tokens(PackTokens(tokens));
  v1::LookupResponse lr;
  EXPECT_EQ(wire::Run(*core_, lookup, &lr).code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace kvtier::testing
