// The token hit rate, once per engine request and only for bytes served
// (DESIGN.md "token hit rate"; issue 10, item 10). The daemon used to count
// every Lookup RPC: an engine request seen by the scheduler, a prefetch and
// two TP ranks counted its prompt three or four times, and a Lookup without a
// lease counted chunks it never served (NVMe chunks it never read) as hits.
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "daemon/cache_core_nvme_harness.h"
#include "kvtier/daemon/request_ledger.h"
#include "kvtier/request_id.h"

namespace kvtier::testing {
namespace {

class CacheCoreAccountingTest : public CacheCoreHarness {
 protected:
  // A leased Lookup of `tokens` under `id`, as a raw client (a ring) may send it.
  Status LookupNamed(const std::vector<int32_t>& tokens, const std::string& id) {
    request_id = id;
    Status st;
    LookupWithTicket(tokens, /*ticket=*/0, &st);
    request_id.clear();
    return st;
  }
};

TEST_F(CacheCoreAccountingTest, AConnectorShapedRequestIsCountedOnce) {
  ASSERT_EQ(Store(Tokens(12)), 3u);
  const auto prompt = Tokens(14);  // 3 full chunks, all cached, and a 2-token tail
  const uint64_t rank1 = core_->OpenSession("tp-rank-1", ExitedPid());
  request_id = "cmpl-7f3a-0";
  EXPECT_EQ(Lookup(prompt, /*acquire=*/false).num_chunks(), 3u);  // the scheduler
  const v1::LookupResponse rank0_lease = Lookup(prompt, true);    // worker, TP rank 0
  const v1::LookupResponse rank1_lease = Lookup(prompt, true, rank1);
  ASSERT_EQ(rank0_lease.num_chunks(), 3u);
  ASSERT_EQ(rank1_lease.num_chunks(), 3u);
  v1::StatsResponse s = Stats();
  EXPECT_EQ(s.lookups(), 3u);
  EXPECT_EQ(s.lookup_tokens(), 14u) << "one request, one prompt";
  EXPECT_EQ(s.hit_tokens(), 12u) << "each served chunk of the request once";
  EXPECT_EQ(s.tiers(0).hits(), 3u);
  EXPECT_EQ(s.tiers(0).misses(), 0u);

  // The next request of the conversation: its own prompt and hits.
  request_id = "cmpl-91c2-0";
  const auto longer = Tokens(22);  // 5 full chunks, 3 cached
  EXPECT_EQ(Lookup(longer, false).num_chunks(), 3u);
  EXPECT_EQ(Lookup(longer, true).num_chunks(), 3u);
  s = Stats();
  EXPECT_EQ(s.lookup_tokens(), 14u + 22u);
  EXPECT_EQ(s.hit_tokens(), 12u + 12u);
  EXPECT_EQ(s.tiers(0).hits(), 6u);
  EXPECT_EQ(s.tiers(0).misses(), 2u) << "chunks 3 and 4 of the second request";
}

TEST_F(CacheCoreAccountingTest, ALookupWithoutALeaseServesNothingAndCountsNoHit) {
  ASSERT_EQ(Store(Tokens(12)), 3u);
  EXPECT_EQ(Lookup(Tokens(12), /*acquire=*/false).num_chunks(), 3u);
  const v1::StatsResponse s = Stats();
  EXPECT_EQ(s.lookup_tokens(), 12u) << "an unnamed call is a request of its own";
  EXPECT_EQ(s.hit_tokens(), 0u);
  EXPECT_EQ(s.tiers(0).hits(), 0u);
  EXPECT_EQ(s.tiers(0).misses(), 3u);
}

TEST_F(CacheCoreAccountingTest, ATooLongRequestIdIsRefusedAndCountsNothing) {
  ASSERT_EQ(Store(Tokens(12)), 3u);
  const v1::StatsResponse before = Stats();
  const Status st = LookupNamed(Tokens(12), std::string(kMaxRequestIdBytes + 1, 'r'));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("request_id is 257 bytes"), std::string::npos) << st.message();
  request_id = std::string(kMaxRequestIdBytes + 1, 'p');
  v1::PrefetchResponse p;
  EXPECT_EQ(Prefetch(Tokens(12), &p).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Stats().DebugString(), before.DebugString());
  request_id = std::string(kMaxRequestIdBytes, 'r');  // the longest allowed
  EXPECT_EQ(Lookup(Tokens(12), false).num_chunks(), 3u);
}

// A lease whose client never got the Lookup's answer (it gave up: the ring
// or gRPC path then ends the lease with ReleaseUnserved) serves nothing: its
// hits and bytes are taken back, and the request's retry counts them once.
// Before, they stayed counted: with NVMe on and short deadlines kvtierd's token
// hit rate read 0.057 where the replay, counting verified bytes, read 0.036.
TEST_F(CacheCoreAccountingTest, ALeaseItsClientNeverGotCountsNoHits) {
  ASSERT_EQ(Store(Tokens(12)), 3u);
  const v1::StatsResponse before = Stats();
  request_id = "cmpl-given-up";
  const v1::LookupResponse unserved = Lookup(Tokens(12), /*acquire=*/true);
  ASSERT_EQ(unserved.num_chunks(), 3u);
  EXPECT_EQ(Stats().hit_tokens(), 12u);
  ASSERT_TRUE(core_->ReleaseUnserved(session_, unserved.lease_id()).ok());
  v1::StatsResponse after = Stats();
  EXPECT_EQ(after.hit_tokens(), before.hit_tokens());
  EXPECT_EQ(after.tiers(0).hits(), before.tiers(0).hits());
  EXPECT_EQ(after.tiers(0).read_bytes(), before.tiers(0).read_bytes());
  EXPECT_EQ(after.active_leases(), 0u);
  EXPECT_EQ(after.lookup_tokens(), 12u) << "the prompt was looked up: it stays counted";
  const v1::LookupResponse retry = Lookup(Tokens(12), /*acquire=*/true);  // the same request
  ASSERT_EQ(retry.num_chunks(), 3u);
  after = Stats();
  EXPECT_EQ(after.hit_tokens(), 12u) << "the retry's hits count, once";
  EXPECT_EQ(after.lookup_tokens(), 12u);
  EXPECT_EQ(core_->ReleaseUnserved(session_, unserved.lease_id()).code(), StatusCode::kNotFound);
}

// Issue 32, item 10: with tensor parallelism every rank leases the request's
// chunks and only the first lease is credited. When that rank's client never
// got its answer, the take-back must leave what another rank's lease covers:
// it served those chunks.
TEST_F(CacheCoreAccountingTest, AnUnservedRanksTakeBackLeavesWhatAnotherRanksLeaseServed) {
  ASSERT_EQ(Store(Tokens(12)), 3u);
  const uint64_t rank1 = core_->OpenSession("tp-rank-1", ExitedPid());
  request_id = "cmpl-tp-0";
  const v1::LookupResponse rank0_lease = Lookup(Tokens(12), /*acquire=*/true);
  const v1::LookupResponse rank1_lease = Lookup(Tokens(12), true, rank1);
  ASSERT_EQ(rank0_lease.num_chunks(), 3u);
  ASSERT_EQ(rank1_lease.num_chunks(), 3u);
  ASSERT_EQ(Stats().hit_tokens(), 12u);
  ASSERT_TRUE(core_->ReleaseUnserved(session_, rank0_lease.lease_id()).ok());
  EXPECT_EQ(Stats().hit_tokens(), 12u) << "rank 1 holds (and serves) the same chunks";
  EXPECT_EQ(Stats().tiers(0).hits(), 3u);
  ASSERT_TRUE(Release(rank1_lease.lease_id(), rank1).ok());
  EXPECT_EQ(Stats().hit_tokens(), 12u);

  // Both ranks unserved: nothing was served, nothing stays counted.
  request_id = "cmpl-tp-1";
  const v1::LookupResponse a = Lookup(Tokens(12), true);
  const v1::LookupResponse b = Lookup(Tokens(12), true, rank1);
  ASSERT_EQ(Stats().hit_tokens(), 24u);
  ASSERT_TRUE(core_->ReleaseUnserved(rank1, b.lease_id()).ok());
  EXPECT_EQ(Stats().hit_tokens(), 24u) << "rank 0's lease still covers them";
  ASSERT_TRUE(core_->ReleaseUnserved(session_, a.lease_id()).ok());
  EXPECT_EQ(Stats().hit_tokens(), 12u);
  EXPECT_EQ(Stats().tiers(0).hits(), 3u);
}

// Issue 32, item 10: the layerwise loader leases from chunk 0, and the chunks
// the engine held already (its own prefix cache hit) were credited as hits and
// bytes read. With first_chunk they are leased but count neither.
TEST_F(CacheCoreAccountingTest, ChunksTheEngineHeldAreLeasedButNeitherHitsNorBytesRead) {
  ASSERT_EQ(Store(Tokens(12)), 3u);
  const v1::StatsResponse before = Stats();
  request_id = "cmpl-engine-held-2";
  first_chunk = 2;
  const v1::LookupResponse lease = Lookup(Tokens(12), /*acquire=*/true);
  first_chunk = 0;
  ASSERT_EQ(lease.num_chunks(), 3u);
  ASSERT_EQ(lease.chunks_size(), 3) << "the whole run is leased";
  const v1::StatsResponse s = Stats();
  EXPECT_EQ(s.hit_tokens(), 4u) << "only chunk 2 came from kvtier";
  EXPECT_EQ(s.tiers(0).hits(), 1u);
  EXPECT_EQ(s.tiers(0).read_bytes() - before.tiers(0).read_bytes(), kPayloadBytes);
  EXPECT_EQ(s.lookup_tokens(), 12u) << "the prompt counts whole";
  ASSERT_TRUE(Release(lease.lease_id()).ok());
}

// A raw control ring hands CacheCore whatever bytes its client wrote.
TEST_F(CacheCoreAccountingTest, ARequestIdThatIsNotUtf8IsRefusedAndCountsNothing) {
  ASSERT_EQ(Store(Tokens(12)), 3u);
  const v1::StatsResponse before = Stats();
  const Status st = LookupNamed(Tokens(12), "cmpl-\xc3\x28");
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("request_id is not UTF-8 (byte 5)"), std::string::npos)
      << st.message();
  EXPECT_EQ(Stats().DebugString(), before.DebugString());
}

// A newline in a request id would forge a line wherever the id is logged.
TEST_F(CacheCoreAccountingTest, ARequestIdWithAControlCharacterIsRefusedAndCountsNothing) {
  ASSERT_EQ(Store(Tokens(12)), 3u);
  const v1::StatsResponse before = Stats();
  for (const std::string& id : {std::string("cmpl-1\nforged"), std::string("cmpl-\x7f"),
                                std::string("cmpl-\xc2\x85")}) {  // LF, DEL, C1 NEL
    const Status st = LookupNamed(Tokens(12), id);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << id;
    EXPECT_NE(st.message().find("request_id holds control character U+"), std::string::npos)
        << st.message();
  }
  EXPECT_EQ(Stats().DebugString(), before.DebugString());
}

// Found by fuzz_cache_core: the ledger counted a request's prompt at its
// first call and credited whatever a later lease under the same id served, so
// a client reusing one request_id for a longer prompt got more hit tokens
// than it looked up (16 against 4). A request's hits stop at the full chunks
// its counted prompt had.
TEST_F(CacheCoreAccountingTest, ARequestIdReusedForALongerPromptCreditsNoMoreThanItsCountedPrompt) {
  ASSERT_EQ(Store(Tokens(16)), 4u);
  request_id = "cmpl-reused";
  EXPECT_EQ(Lookup(Tokens(4), /*acquire=*/false).num_chunks(), 1u);
  const v1::LookupResponse lease = Lookup(Tokens(16), /*acquire=*/true);
  ASSERT_EQ(lease.num_chunks(), 4u) << "the lease itself is served whole";
  const v1::StatsResponse s = Stats();
  EXPECT_EQ(s.lookup_tokens(), 4u) << "the request's prompt was counted at its first call";
  EXPECT_EQ(s.hit_tokens(), 4u) << "one chunk of the counted prompt, not 4";
  EXPECT_EQ(s.tiers(0).hits(), 1u);
  EXPECT_LE(s.hit_tokens(), s.lookup_tokens());
  ASSERT_TRUE(Release(lease.lease_id()).ok());
}

// `a_` (3 chunks) on NVMe only. Its SetUp made one unnamed lookup of `a_`
// (12 prompt tokens, no hit); the tests count from there.
using NvmeAccountingTest = CacheCorePrefetchTest;
constexpr uint64_t kSetUpTokens = 12;

TEST_F(NvmeAccountingTest, LookupPrefetchThenLeasedLoadCountsOneRequestOfNvmeHits) {
  request_id = "cmpl-prefetched";
  EXPECT_EQ(Lookup(a_, false).nvme_chunks(), 3u);  // the scheduler: nothing read
  v1::StatsResponse s;
  EXPECT_EQ(NvmeStats(s).hits(), 0u) << "NVMe chunks never read are no hits";
  EXPECT_EQ(s.hit_tokens(), 0u);
  v1::PrefetchResponse p;
  ASSERT_TRUE(Prefetch(a_, &p).ok());
  ASSERT_NE(p.ticket(), 0u);
  WaitPrefetchDone(p.ticket());
  const v1::LookupResponse l = LookupWithTicket(a_, p.ticket());
  ASSERT_EQ(l.num_chunks(), 3u);
  ASSERT_EQ(l.prefetched_chunks(), 3u);
  EXPECT_EQ(NvmeStats(s).hits(), 3u) << "on NVMe when the request looked them up";
  EXPECT_EQ(s.tiers(0).hits(), 0u);
  EXPECT_EQ(s.lookup_tokens(), kSetUpTokens + 12u);
  EXPECT_EQ(s.hit_tokens(), 12u);
  ASSERT_TRUE(Release(l.lease_id()).ok());
}

TEST_F(NvmeAccountingTest, AnUnnamedPrefetchAndTheLookupTakingItsTicketAreOneRequest) {
  v1::PrefetchResponse p;
  ASSERT_TRUE(Prefetch(a_, &p).ok());
  WaitPrefetchDone(p.ticket());
  const v1::LookupResponse l = LookupWithTicket(a_, p.ticket());
  ASSERT_EQ(l.num_chunks(), 3u);
  v1::StatsResponse s;
  EXPECT_EQ(NvmeStats(s).hits(), 3u);
  EXPECT_EQ(s.lookup_tokens(), kSetUpTokens + 12u);
  EXPECT_EQ(s.hit_tokens(), 12u);
  ASSERT_TRUE(Release(l.lease_id()).ok());
}

TEST_F(NvmeAccountingTest, APromotingLeaseCountsNvmeHitsForWhatItRead) {
  const v1::LookupResponse l = Lookup(a_, true);
  ASSERT_EQ(l.num_chunks(), 3u);
  ASSERT_EQ(l.nvme_chunks(), 3u);
  v1::StatsResponse s;
  EXPECT_EQ(NvmeStats(s).hits(), 3u);
  EXPECT_EQ(s.tiers(0).hits(), 0u);
  EXPECT_EQ(s.hit_tokens(), 12u);
  ASSERT_TRUE(Release(l.lease_id()).ok());
}

TEST(RequestLedgerTest, CreditsEachChunkOfARequestOnceAndForgetsTheOldestPastCapacity) {
  RequestLedger ledger(2);
  const std::string a = RequestLedger::Named("a"), b = RequestLedger::Named("b");
  using Range = std::pair<uint64_t, uint64_t>;
  const auto credit = [&](const std::string& key, uint64_t served) {
    const RequestLedger::Range r = ledger.Credit(key, 0, served);
    return Range(r.from, r.to);
  };
  EXPECT_TRUE(ledger.FirstSight(a, 4));
  EXPECT_FALSE(ledger.FirstSight(a, 9)) << "seen: its prompt stays the first one counted";
  EXPECT_EQ(credit(a, 2), Range(0, 2));
  EXPECT_EQ(credit(a, 3), Range(2, 3)) << "a later lease of more chunks adds only the new ones";
  EXPECT_EQ(credit(a, 1), Range(3, 3)) << "a shorter one adds nothing";
  EXPECT_EQ(credit(a, 9), Range(3, 4)) << "never past the 4 chunks of the prompt counted";
  EXPECT_TRUE(ledger.FirstSight(b, 1));
  EXPECT_TRUE(ledger.FirstSight(RequestLedger::Ticket(9), 1));  // forgets a, the oldest
  EXPECT_EQ(ledger.size(), 2u);
  EXPECT_TRUE(ledger.FirstSight(a, 2)) << "forgotten: a new request";
  EXPECT_EQ(credit(a, 5), Range(0, 2));
  EXPECT_TRUE(ledger.FirstSight("", 3)) << "an unnamed call is always a request of its own";
  EXPECT_EQ(credit("", 5), Range(0, 5));
  EXPECT_NE(RequestLedger::Named("t1"), RequestLedger::Ticket(1)) << "ids never name tickets";
}

}  // namespace
}  // namespace kvtier::testing
