// CacheCore's HBM tier on the gpu module's host emulation (the pool is shared
// host memory, opened by its IPC handle as a client would): promotion on hit,
// leases on HBM copies, HBM a subset of DRAM, leaf-first eviction, prefetch
// into HBM, and a clear error without a GPU.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>

#include "daemon/cache_core_harness.h"
#include "kvtier/gpu/runtime.h"

namespace kvtier::testing {
namespace {

using namespace std::chrono_literals;

class CacheCoreHbmTest : public ::testing::Test, public CacheCoreDriver {
 protected:
  static CacheCoreOptions HbmOptions(uint64_t dram_slots, uint64_t hbm_slots) {
    CacheCoreOptions o = Options(dram_slots);
    o.hbm.bytes = hbm_slots * kSlotBytes;
    o.hbm.backend = HbmBackend::kHost;
    return o;
  }
  void StartWithHbm(uint64_t dram_slots, uint64_t hbm_slots) {
    ASSERT_NO_FATAL_FAILURE(Start(HbmOptions(dram_slots, hbm_slots)));
    ASSERT_NE(core_->hbm(), nullptr);
    host_ = gpu::Runtime::CreateHost();
    const gpu::GpuStatus st =
        host_->OpenExported(core_->hbm()->ipc_handle(), hbm_slots * kSlotBytes, &pool_);
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  void TearDown() override {
    pool_.Reset();
    core_.reset();
  }

  v1::LookupResponse LookupHbm(const std::vector<int32_t>& tokens, bool acquire) {
    return Lookup(tokens, acquire, 0, /*hbm=*/true);
  }

  const v1::TierStats* Tier(const v1::StatsResponse& s, const std::string& name) {
    for (const auto& t : s.tiers()) {
      if (t.name() == name) return &t;
    }
    return nullptr;
  }
  // Polls until the HBM tier holds `chunks` chunks after `copies` copies in
  // all (the I/O workers run in real time), for at most 10 s.
  void WaitHbmChunks(uint64_t chunks, uint64_t copies = 0) {
    if (copies == 0) copies = chunks;
    const auto until = std::chrono::steady_clock::now() + 10s;
    uint64_t now = 0, copied = 0;
    while (std::chrono::steady_clock::now() < until) {
      const v1::StatsResponse s = Stats();
      now = Tier(s, "hbm")->chunks();
      copied = Tier(s, "hbm")->write_bytes() / kPayloadBytes;
      if (now == chunks && copied == copies) return;
      std::this_thread::sleep_for(1ms);
    }
    FAIL() << "HBM holds " << now << " chunks after " << copied << " copies, expected " << chunks
           << " after " << copies;
  }
  // Whether HBM location `loc` holds chunk `key`'s payload, behind a header
  // with the HBM sequence the lookup gave.
  bool HbmHolds(const v1::ChunkLocation& loc, const ChunkKey& key) const {
    const auto* base = static_cast<const std::byte*>(pool_.data());
    const auto* slot = base + loc.hbm_payload_offset() - kHeaderBytes;
    const auto p = PayloadFor(key);
    return std::memcmp(base + loc.hbm_payload_offset(), p.data(), p.size()) == 0 &&
           SlotSequence(slot) == loc.hbm_sequence();
  }

  std::unique_ptr<gpu::Runtime> host_;
  gpu::DeviceBuffer pool_;  // the daemon's pool, opened as a client opens it
};

TEST_F(CacheCoreHbmTest, OffByDefaultLookupsGiveNoHbmLocations) {
  ASSERT_NO_FATAL_FAILURE(Start(Options()));
  EXPECT_EQ(core_->hbm(), nullptr);
  const auto t = Tokens(3 * kChunkTokens);
  ASSERT_EQ(Store(t), 3u);
  const v1::LookupResponse r = LookupHbm(t, true);
  ASSERT_EQ(r.num_chunks(), 3u);
  for (const auto& loc : r.chunks()) EXPECT_EQ(loc.hbm_payload_offset(), 0u);
  EXPECT_EQ(Tier(Stats(), "hbm"), nullptr);
  v1::PrefetchResponse pr;
  const Status st = Prefetch(t, &pr, 0, 0, 0, /*to_hbm=*/true);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("--hbm-bytes"), std::string::npos) << st.message();
  EXPECT_EQ(Stats().active_prefetches(), 0u) << "a refused prefetch holds nothing";
}

TEST_F(CacheCoreHbmTest, AHitIsCopiedIntoHbmAndTheNextLeaseHoldsTheHbmCopy) {
  ASSERT_NO_FATAL_FAILURE(StartWithHbm(16, 8));
  const auto t = Tokens(3 * kChunkTokens + 1);
  const auto keys = ComputeChunkKeys(ns_, t, kChunkTokens);
  ASSERT_EQ(Store(t), 3u);
  EXPECT_EQ(Tier(Stats(), "hbm")->chunks(), 0u) << "a store lands in DRAM only";

  const v1::LookupResponse first = LookupHbm(t, false);
  EXPECT_EQ(first.num_chunks(), 3u);
  EXPECT_EQ(first.hbm_chunks(), 0u);
  ASSERT_NO_FATAL_FAILURE(WaitHbmChunks(3));

  const v1::LookupResponse r = LookupHbm(t, true);
  ASSERT_EQ(r.chunks_size(), 3);
  EXPECT_EQ(r.hbm_chunks(), 3u);
  for (int i = 0; i < 3; ++i) {
    ASSERT_NE(r.chunks(i).hbm_payload_offset(), 0u) << "chunk " << i;
    EXPECT_TRUE(HbmHolds(r.chunks(i), keys[i])) << "chunk " << i;
  }
  EXPECT_TRUE(LeasedBytesMatch(t, r)) << "the DRAM locations stay valid too";
  const v1::StatsResponse s = Stats();
  EXPECT_EQ(Tier(s, "hbm")->hits(), 3u);
  EXPECT_EQ(Tier(s, "hbm")->write_bytes(), 3 * kPayloadBytes);
  EXPECT_EQ(Tier(s, "hbm")->read_bytes(), 3 * kPayloadBytes);
  EXPECT_EQ(Tier(s, "dram")->hits(), 0u) << "the first lookup leased nothing: it served no hit";
  EXPECT_TRUE(Release(r.lease_id()).ok());
}

// The collision seam with HBM on: a chunk whose DRAM header fails the token
// check is not leased from HBM either, nor are the chunks after it.
TEST_F(CacheCoreHbmTest, ACollidingChunkIsNotLeasedFromHbm) {
  ASSERT_NO_FATAL_FAILURE(StartWithHbm(16, 8));
  const auto t = Tokens(3 * kChunkTokens);
  const auto keys = Keys(t);
  ASSERT_EQ(Store(t), 3u);
  LookupHbm(t, false);
  ASSERT_NO_FATAL_FAILURE(WaitHbmChunks(3));
  const v1::LookupResponse l = LookupHbm(t, true);
  ASSERT_EQ(l.hbm_chunks(), 3u);
  ASSERT_TRUE(Release(l.lease_id()).ok());
  ForgeCollision(l.chunks(1).payload_offset(), keys[1], keys[0], {4, 5, 6, 8});
  const v1::LookupResponse cut = LookupHbm(t, true);
  EXPECT_EQ(cut.num_chunks(), 1u);
  EXPECT_EQ(cut.hbm_chunks(), 1u);
  v1::PrefetchResponse p;
  ASSERT_TRUE(Prefetch(t, &p, 0, 0, 0, /*to_hbm=*/true).ok());
  EXPECT_EQ(p.total_chunks(), 1u);
}

TEST_F(CacheCoreHbmTest, ALookupWithoutHbmNeitherLeasesNorCopiesIntoHbm) {
  ASSERT_NO_FATAL_FAILURE(StartWithHbm(16, 8));
  const auto t = Tokens(2 * kChunkTokens);
  ASSERT_EQ(Store(t), 2u);
  const v1::LookupResponse r = Lookup(t, true);
  ASSERT_EQ(r.chunks_size(), 2);
  for (const auto& loc : r.chunks()) EXPECT_EQ(loc.hbm_payload_offset(), 0u);
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(Tier(Stats(), "hbm")->chunks(), 0u);
}

TEST_F(CacheCoreHbmTest, DramEvictionDropsTheHbmCopySoHbmStaysASubsetOfDram) {
  ASSERT_NO_FATAL_FAILURE(StartWithHbm(8, 8));
  const auto a = Tokens(4 * kChunkTokens, 1000);
  ASSERT_EQ(Store(a), 4u);
  LookupHbm(a, false);
  ASSERT_NO_FATAL_FAILURE(WaitHbmChunks(4));
  // 8 more chunks fill the arena: DRAM evicts all of `a` (least recently used).
  ASSERT_EQ(Store(Tokens(4 * kChunkTokens, 2000)), 4u);
  ASSERT_EQ(Store(Tokens(4 * kChunkTokens, 3000)), 4u);
  EXPECT_EQ(Lookup(a, false).num_chunks(), 0u);
  const v1::StatsResponse s = Stats();
  EXPECT_EQ(Tier(s, "hbm")->chunks(), 0u) << "an HBM copy outlived its DRAM chunk";
  EXPECT_EQ(Tier(s, "hbm")->used_bytes(), 0u);
}

TEST_F(CacheCoreHbmTest, AnHbmLeaseKeepsBothCopiesUntilReleased) {
  ASSERT_NO_FATAL_FAILURE(StartWithHbm(8, 8));
  const auto a = Tokens(2 * kChunkTokens, 1000);
  const auto keys = ComputeChunkKeys(ns_, a, kChunkTokens);
  ASSERT_EQ(Store(a), 2u);
  LookupHbm(a, false);
  ASSERT_NO_FATAL_FAILURE(WaitHbmChunks(2));
  const v1::LookupResponse r = LookupHbm(a, true);
  ASSERT_EQ(r.hbm_chunks(), 2u);
  // Other prompts want the whole arena: the leased chunks must stay.
  for (int32_t first = 2000; first < 6000; first += 1000) Store(Tokens(4 * kChunkTokens, first));
  EXPECT_TRUE(HbmHolds(r.chunks(0), keys[0]));
  EXPECT_TRUE(HbmHolds(r.chunks(1), keys[1]));
  EXPECT_TRUE(LeasedBytesMatch(a, r));
  EXPECT_EQ(Tier(Stats(), "hbm")->chunks(), 2u);
  ASSERT_TRUE(Release(r.lease_id()).ok());
  Store(Tokens(4 * kChunkTokens, 7000));
  Store(Tokens(4 * kChunkTokens, 8000));
  EXPECT_EQ(Tier(Stats(), "hbm")->chunks(), 0u) << "released: DRAM evicted them, HBM followed";
}

TEST_F(CacheCoreHbmTest, HbmEvictsLeavesFirstAndNeverHoldsAnOrphan) {
  ASSERT_NO_FATAL_FAILURE(StartWithHbm(16, 3));
  const auto a = Tokens(3 * kChunkTokens, 1000);
  const auto b = Tokens(2 * kChunkTokens, 2000);
  ASSERT_EQ(Store(a), 3u);
  ASSERT_EQ(Store(b), 2u);
  LookupHbm(a, false);
  ASSERT_NO_FATAL_FAILURE(WaitHbmChunks(3));  // a fills HBM
  LookupHbm(b, false);
  // b's two chunks take the slots of a's leaves (a2, then a1); a0 stays: it
  // had a child in HBM when b0 came, and is older than b's chunks.
  ASSERT_NO_FATAL_FAILURE(WaitHbmChunks(3, 5));
  EXPECT_EQ(Tier(Stats(), "hbm")->evictions(), 2u);
  // b first: a lookup with hbm queues its chunks not in HBM, and a's copies
  // must not race with what this test reads (b's lease pins its chunks).
  const v1::LookupResponse rb = LookupHbm(b, true);
  const v1::LookupResponse ra = LookupHbm(a, true);
  ASSERT_EQ(ra.chunks_size(), 3);
  ASSERT_EQ(rb.chunks_size(), 2);
  EXPECT_NE(ra.chunks(0).hbm_payload_offset(), 0u);
  EXPECT_EQ(ra.chunks(1).hbm_payload_offset(), 0u);
  EXPECT_EQ(ra.chunks(2).hbm_payload_offset(), 0u);
  EXPECT_NE(rb.chunks(0).hbm_payload_offset(), 0u);
  EXPECT_NE(rb.chunks(1).hbm_payload_offset(), 0u);
}

// Issue 32, item 5: an HBM slot that holds a, then b, then a again. A reader
// whose lease on a's first copy lapsed, and whose copy spanned b, reads the
// slot's sequence back after its copies: it must not find the one it was given.
TEST_F(CacheCoreHbmTest, ASlotThatHoldsAThenBThenAAgainShowsALapsedReaderANewSequence) {
  ASSERT_NO_FATAL_FAILURE(StartWithHbm(16, 1));
  const auto a = Tokens(kChunkTokens, 1000);
  const auto b = Tokens(kChunkTokens, 2000);
  const auto a_key = ComputeChunkKeys(ns_, a, kChunkTokens)[0];
  ASSERT_EQ(Store(a), 1u);
  ASSERT_EQ(Store(b), 1u);
  LookupHbm(a, false);
  ASSERT_NO_FATAL_FAILURE(WaitHbmChunks(1));
  const v1::LookupResponse first = LookupHbm(a, true);
  ASSERT_EQ(first.chunks_size(), 1);
  const v1::ChunkLocation seen = first.chunks(0);
  ASSERT_NE(seen.hbm_payload_offset(), 0u);
  ASSERT_TRUE(HbmHolds(seen, a_key));
  ASSERT_TRUE(Release(first.lease_id()).ok());  // as if it lapsed: the reader copies on

  LookupHbm(b, false);  // b takes the only HBM slot
  ASSERT_NO_FATAL_FAILURE(WaitHbmChunks(1, 2));
  LookupHbm(a, false);  // and a takes it back
  ASSERT_NO_FATAL_FAILURE(WaitHbmChunks(1, 3));
  const v1::LookupResponse again = LookupHbm(a, true);
  ASSERT_EQ(again.chunks_size(), 1);
  ASSERT_EQ(again.chunks(0).hbm_payload_offset(), seen.hbm_payload_offset()) << "the same slot";
  EXPECT_TRUE(HbmHolds(again.chunks(0), a_key));
  const auto* slot =
      static_cast<const std::byte*>(pool_.data()) + seen.hbm_payload_offset() - kHeaderBytes;
  EXPECT_NE(SlotSequence(slot), seen.hbm_sequence())
      << "the lapsed reader would take a copy that spanned b for a's";
  EXPECT_NE(seen.hbm_sequence(), seen.sequence()) << "an HBM copy has a sequence of its own";
  EXPECT_TRUE(Release(again.lease_id()).ok());
}

TEST_F(CacheCoreHbmTest, PrefetchToHbmCopiesThePrefixIntoHbm) {
  ASSERT_NO_FATAL_FAILURE(StartWithHbm(16, 8));
  const auto t = Tokens(3 * kChunkTokens);
  ASSERT_EQ(Store(t), 3u);
  v1::PrefetchResponse pr;
  ASSERT_TRUE(Prefetch(t, &pr, 0, 0, 0, /*to_hbm=*/true).ok());
  ASSERT_NE(pr.ticket(), 0u);
  ASSERT_NO_FATAL_FAILURE(WaitHbmChunks(3));
  v1::PrefetchStatusResponse ps;
  ASSERT_TRUE(PrefetchStatus(pr.ticket(), &ps).ok());
  EXPECT_EQ(ps.hbm_chunks(), 3u);
}

TEST_F(CacheCoreHbmTest, APrefetchLargerThanThePoolSaysWhenNoMoreGoesIntoHbm) {
  ASSERT_NO_FATAL_FAILURE(StartWithHbm(16, 2));
  const auto t = Tokens(4 * kChunkTokens);
  ASSERT_EQ(Store(t), 4u);
  v1::PrefetchResponse pr;
  ASSERT_TRUE(Prefetch(t, &pr, 0, 0, 0, /*to_hbm=*/true).ok());
  v1::PrefetchStatusResponse ps;
  const auto until = std::chrono::steady_clock::now() + 10s;
  do {
    ASSERT_TRUE(PrefetchStatus(pr.ticket(), &ps).ok());
  } while (!ps.hbm_done() && std::chrono::steady_clock::now() < until);
  EXPECT_TRUE(ps.hbm_done());
  EXPECT_EQ(ps.hbm_chunks(), 2u) << "two slots, and chunk 2 may not evict its own ancestors";
  EXPECT_EQ(ps.total_chunks(), 4u);
  v1::PrefetchResponse plain;
  ASSERT_TRUE(Prefetch(t, &plain).ok());
  ASSERT_TRUE(PrefetchStatus(plain.ticket(), &ps).ok());
  EXPECT_FALSE(ps.hbm_done()) << "hbm_done is only for to_hbm tickets";
}

TEST(CacheCoreHbmCreate, WithoutAGpuTheCudaTierIsAClearError) {
  std::unique_ptr<gpu::Runtime> cuda;
  if (gpu::Runtime::CreateCuda(0, &cuda).ok()) GTEST_SKIP() << "a GPU is present";
  CacheCoreOptions o = CacheCoreDriver::Options();
  o.hbm.bytes = 64 * kSlotBytes;
  ManualClock clock;
  auto core = CacheCore::Create(o, 7, clock);
  ASSERT_FALSE(core.ok());
  EXPECT_EQ(core.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(core.status().message().find("--hbm-bytes needs a CUDA GPU"), std::string::npos)
      << core.status().message();
}

TEST(CacheCoreHbmCreate, ABadPoolSizeIsRefused) {
  CacheCoreOptions o = CacheCoreDriver::Options();
  o.hbm.bytes = 5000;
  o.hbm.backend = HbmBackend::kHost;
  ManualClock clock;
  auto core = CacheCore::Create(o, 7, clock);
  ASSERT_FALSE(core.ok());
  EXPECT_EQ(core.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(core.status().message().find("hbm_bytes 5000"), std::string::npos);
}

}  // namespace
}  // namespace kvtier::testing
