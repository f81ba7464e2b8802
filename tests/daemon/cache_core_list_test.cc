// CacheCore's admin listing (ListChunksRequest, kvtierctl ls): every chunk of
// a namespace or of a prompt's prefix, with the tiers holding it (DRAM and a
// real O_DIRECT NVMe file with RocksDB), sizes, hits and pins; the limit and
// the count it leaves out; bad requests refused.
#include <gtest/gtest.h>

#include <set>

#include "daemon/cache_core_nvme_harness.h"

namespace kvtier::testing {
namespace {

class CacheCoreListTest : public CacheCoreNvmeTest {
 protected:
  Status List(v1::ListChunksResponse* resp, const std::vector<int32_t>& tokens = {},
              uint32_t limit = 0, const std::string* ns = nullptr) {
    v1::ListChunksRequest req;
    req.set_namespace_id(ns ? *ns : ns_wire_);
    if (!tokens.empty()) req.set_tokens(PackTokens(tokens));
    req.set_limit(limit);
    return wire::Run(*core_, req, resp);
  }
  static std::vector<std::string> Tiers(const v1::ChunkInfo& c) {
    return {c.tiers().begin(), c.tiers().end()};
  }
  void DrainWrites() {
    while (core_->DestageOnce() > 0) {
    }
  }
};

using TierList = std::vector<std::string>;

TEST_F(CacheCoreListTest, ListsEachChunkWithItsTiersSizesHitsAndPins) {
  StartWithNvme(/*dram_slots=*/16, /*good_writes=*/1000);
  const auto a = Tokens(12);
  ASSERT_EQ(Store(a), 3u);
  v1::ListChunksResponse r;
  ASSERT_TRUE(List(&r).ok());
  ASSERT_EQ(r.chunks_size(), 3);
  for (const auto& c : r.chunks()) EXPECT_EQ(Tiers(c), TierList{"dram"});  // not written yet
  DrainWrites();
  r.Clear();
  ASSERT_TRUE(List(&r).ok());
  ASSERT_EQ(r.chunks_size(), 3);
  EXPECT_EQ(r.left_out(), 0u);
  std::set<std::string> keys;
  for (const auto& c : r.chunks()) {
    keys.insert(c.key());
    EXPECT_EQ(Tiers(c), (TierList{"dram", "nvme"}));
    EXPECT_EQ(c.payload_bytes(), kPayloadBytes);
    EXPECT_EQ(c.slot_bytes(), kSlotBytes);
    EXPECT_TRUE(c.has_age());
    EXPECT_LE(c.age_s(), 60u);
    EXPECT_EQ(c.hits(), 0u);
    EXPECT_FALSE(c.pinned());
  }
  std::set<std::string> stored;
  for (const ChunkKey& k : Keys(a)) stored.insert(k.ToBytes());
  EXPECT_EQ(keys, stored);

  // A leasing Lookup: each chunk hit once, and pinned until released.
  const v1::LookupResponse lease = Lookup(a, /*acquire=*/true);
  ASSERT_EQ(lease.num_chunks(), 3u);
  r.Clear();
  ASSERT_TRUE(List(&r).ok());
  for (const auto& c : r.chunks()) {
    EXPECT_EQ(c.hits(), 1u);
    EXPECT_TRUE(c.pinned());
  }
  ASSERT_TRUE(Release(lease.lease_id()).ok());
  r.Clear();
  ASSERT_TRUE(List(&r).ok());
  for (const auto& c : r.chunks()) EXPECT_FALSE(c.pinned());

  // A prompt prefix, in prompt order; a limit, with what it left out.
  r.Clear();
  ASSERT_TRUE(List(&r, Tokens(9)).ok());  // two full chunks and a tail
  ASSERT_EQ(r.chunks_size(), 2);
  EXPECT_EQ(r.chunks(0).key(), Keys(a)[0].ToBytes());
  EXPECT_EQ(r.chunks(1).key(), Keys(a)[1].ToBytes());
  r.Clear();
  ASSERT_TRUE(List(&r, {}, /*limit=*/2).ok());
  EXPECT_EQ(r.chunks_size(), 2);
  EXPECT_EQ(r.left_out(), 1u);
}

TEST_F(CacheCoreListTest, ChunksOnlyOnNvmeAreListedWithoutAnAge) {
  StartWithNvme(/*dram_slots=*/4, /*good_writes=*/1000);
  const auto a = Tokens(12), b = Tokens(12, 1000);
  ASSERT_EQ(Store(a), 3u);
  DrainWrites();
  ASSERT_EQ(Store(b), 3u);  // DRAM holds 4: some of a's chunks leave it
  DrainWrites();
  v1::ListChunksResponse r;
  ASSERT_TRUE(List(&r).ok());
  ASSERT_EQ(r.chunks_size(), 6);
  size_t nvme_only = 0;
  for (const auto& c : r.chunks()) {
    if (Tiers(c) == TierList{"nvme"}) {
      ++nvme_only;
      EXPECT_FALSE(c.has_age());
      EXPECT_EQ(c.slot_bytes(), kSlotBytes);
      EXPECT_EQ(c.payload_bytes(), kPayloadBytes);  // the namespace is open
    } else {
      EXPECT_EQ(Tiers(c), (TierList{"dram", "nvme"}));
      EXPECT_TRUE(c.has_age());
    }
  }
  EXPECT_EQ(nvme_only, 2u);
}

TEST_F(CacheCoreListTest, BadRequestsAreRefused) {
  StartWithNvme(/*dram_slots=*/16, /*good_writes=*/1000);
  ASSERT_EQ(Store(Tokens(8)), 2u);
  v1::ListChunksResponse r;
  const std::string short_id(15, 'x'), unknown(16, 'u');
  EXPECT_EQ(List(&r, {}, 0, &short_id).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(List(&r, {}, 0, &unknown).code(), StatusCode::kNotFound);
  EXPECT_EQ(List(&r, Tokens(8), 0, &unknown).code(), StatusCode::kNotFound);
  EXPECT_EQ(List(&r, Tokens(3)).code(), StatusCode::kInvalidArgument);  // under one chunk
  EXPECT_EQ(List(&r, {}, core::kMaxListedChunks + 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.chunks_size(), 0);
}

}  // namespace
}  // namespace kvtier::testing
