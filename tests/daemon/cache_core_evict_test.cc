// CacheCore's admin eviction (EvictRequest): a namespace, a prompt prefix's
// subtree or everything, from DRAM, NVMe (real O_DIRECT file and RocksDB) and
// HBM (host emulation); chunks under lease are kept and counted; queued NVMe
// writes of removed chunks are dropped; a bad scope changes nothing.
#include <gtest/gtest.h>

#include "daemon/cache_core_nvme_harness.h"
#include "kvtier/gpu/runtime.h"

namespace kvtier::testing {
namespace {

class CacheCoreEvictTest : public CacheCoreNvmeTest {
 protected:
  static v1::EvictRequest All() {
    v1::EvictRequest r;
    r.set_all(true);
    return r;
  }
  v1::EvictRequest Namespace() const {
    v1::EvictRequest r;
    r.set_namespace_id(ns_wire_);
    return r;
  }
  v1::EvictRequest Prefix(const std::vector<int32_t>& tokens) const {
    v1::EvictRequest r = Namespace();
    r.set_tokens(PackTokens(tokens));
    return r;
  }
  // Runs the eviction; returns tier -> {removed, kept}.
  std::map<std::string, std::pair<uint64_t, uint64_t>> Evict(const v1::EvictRequest& req) {
    v1::EvictResponse resp;
    const Status st = wire::Run(*core_, req, &resp);
    EXPECT_TRUE(st.ok()) << st.ToString();
    std::map<std::string, std::pair<uint64_t, uint64_t>> out;
    for (const auto& t : resp.tiers()) out[t.tier()] = {t.removed(), t.kept()};
    return out;
  }
  void DrainWrites() {
    while (core_->DestageOnce() > 0) {
    }
  }
  uint64_t Chunks(const std::string& tier) {
    const v1::StatsResponse s = Stats();
    for (const auto& t : s.tiers()) {
      if (t.name() == tier) return t.chunks();
    }
    ADD_FAILURE() << "no tier " << tier;
    return 0;
  }
  // Opens a second namespace (another model) and makes it the one the driver uses.
  void SwitchToOtherNamespace() {
    v1::OpenNamespaceRequest req;
    req.set_session_id(session_);
    *req.mutable_spec() = TinyProtoSpec();
    req.mutable_spec()->set_model_id("other-model");
    v1::OpenNamespaceResponse resp;
    ASSERT_TRUE(wire::Run(*core_, req, &resp).ok());
    NamespaceSpec spec = TinySpec();
    spec.model_id = "other-model";
    ns_wire_ = resp.namespace_id();
    ns_ = spec.Digest();
    ASSERT_EQ(ns_.ToBytes(), ns_wire_);
  }
};

using Removal = std::pair<uint64_t, uint64_t>;  // removed, kept

TEST_F(CacheCoreEvictTest, NamespaceLeavesNoChunkInDramOrNvme) {
  StartWithNvme(/*dram_slots=*/16, /*good_writes=*/1000);
  const auto a = Tokens(12), b = Tokens(8, 100);
  ASSERT_EQ(Store(a), 3u);
  ASSERT_EQ(Store(b), 2u);
  DrainWrites();
  ASSERT_EQ(Chunks("nvme"), 5u);
  auto r = Evict(Namespace());
  EXPECT_EQ(r["dram"], Removal(5, 0));
  EXPECT_EQ(r["nvme"], Removal(5, 0));
  EXPECT_EQ(Chunks("dram"), 0u);
  EXPECT_EQ(Chunks("nvme"), 0u);
  EXPECT_EQ(UsedBytes(), 0u);
  EXPECT_EQ(Lookup(a, true).num_chunks(), 0u) << "nothing to promote from NVMe either";
  EXPECT_EQ(Stats().tiers(0).evictions(), 0u) << "an admin eviction is not a capacity eviction";
  // Stored again, it is cached again.
  ASSERT_EQ(Store(a), 3u);
  EXPECT_EQ(Lookup(a, false).num_chunks(), 3u);
}

TEST_F(CacheCoreEvictTest, EvictedNvmeChunksStayGoneAfterARestart) {
  StartWithNvme(16, 1000);
  ASSERT_EQ(Store(Tokens(12)), 3u);
  DrainWrites();
  Evict(Namespace());
  core_.reset();
  inner_.reset();
  StartWithNvme(16, 1000);  // the same slot file and RocksDB index
  EXPECT_EQ(Chunks("nvme"), 0u);
  EXPECT_EQ(Lookup(Tokens(12), true).num_chunks(), 0u);
}

TEST_F(CacheCoreEvictTest, LeasedChunksAndTheirAncestorsAreKeptAndCounted) {
  StartWithNvme(16, 1000);
  const auto a = Tokens(12);
  ASSERT_EQ(Store(a), 3u);
  DrainWrites();
  const v1::LookupResponse lease = Lookup(std::vector<int32_t>(a.begin(), a.begin() + 8), true);
  ASSERT_EQ(lease.num_chunks(), 2u);
  auto r = Evict(Namespace());
  EXPECT_EQ(r["dram"], Removal(1, 2)) << "chunk 2 goes; the leased chunks 0 and 1 stay";
  EXPECT_EQ(r["nvme"], Removal(3, 0)) << "NVMe copies are not leased";
  EXPECT_TRUE(LeasedBytesMatch(a, lease)) << "a leased chunk's bytes are untouched";
  EXPECT_EQ(Lookup(a, false).num_chunks(), 2u);
  ASSERT_TRUE(Release(lease.lease_id()).ok());
  r = Evict(Namespace());
  EXPECT_EQ(r["dram"], Removal(2, 0));
  EXPECT_EQ(Lookup(a, false).num_chunks(), 0u);
}

TEST_F(CacheCoreEvictTest, PrefixRemovesThePromptsThatBeginWithItOnly) {
  StartWithNvme(16, 1000);
  const auto a = Tokens(12);
  auto b = Tokens(12);
  b[9] = 999;  // b shares chunks 0 and 1 with a
  const auto c = Tokens(8, 500);
  ASSERT_EQ(Store(a), 3u);
  ASSERT_EQ(Store(b), 1u);
  ASSERT_EQ(Store(c), 2u);
  DrainWrites();
  // a's first 9 tokens: the last full chunk is chunk 1, so chunk 1 and both
  // chunk 2s go; chunk 0 (a shorter prefix) and c stay.
  auto r = Evict(Prefix(std::vector<int32_t>(a.begin(), a.begin() + 9)));
  EXPECT_EQ(r["dram"], Removal(3, 0));
  EXPECT_EQ(r["nvme"], Removal(3, 0));
  EXPECT_EQ(Lookup(a, false).num_chunks(), 1u);
  EXPECT_EQ(Lookup(b, false).num_chunks(), 1u);
  EXPECT_EQ(Lookup(c, false).num_chunks(), 2u);
}

TEST_F(CacheCoreEvictTest, AllRemovesEveryNamespaceAndANamespaceOnlyItsOwn) {
  StartWithNvme(16, 1000);
  const auto a = Tokens(8);
  ASSERT_EQ(Store(a), 2u);
  const std::string first = ns_wire_;
  ASSERT_NO_FATAL_FAILURE(SwitchToOtherNamespace());
  ASSERT_EQ(Store(a), 2u);  // the same tokens under another model: other chunks
  DrainWrites();
  v1::EvictRequest only_first;
  only_first.set_namespace_id(first);
  auto r = Evict(only_first);
  EXPECT_EQ(r["dram"], Removal(2, 0));
  EXPECT_EQ(r["nvme"], Removal(2, 0));
  EXPECT_EQ(Lookup(a, false).num_chunks(), 2u) << "the other namespace keeps its chunks";
  r = Evict(All());
  EXPECT_EQ(r["dram"], Removal(2, 0));
  EXPECT_EQ(r["nvme"], Removal(2, 0));
  EXPECT_EQ(Chunks("dram") + Chunks("nvme"), 0u);
}

TEST_F(CacheCoreEvictTest, QueuedNvmeWritesOfEvictedChunksAreDroppedNotSkipped) {
  StartWithNvme(16, 1000);
  ASSERT_EQ(Store(Tokens(12)), 3u);
  ASSERT_EQ(Stats().tiers(1).pending_writes(), 3u);
  Evict(Namespace());
  EXPECT_EQ(Stats().tiers(1).pending_writes(), 0u);
  DrainWrites();
  EXPECT_EQ(Chunks("nvme"), 0u) << "an evicted chunk must not land on NVMe afterwards";
  EXPECT_EQ(Stats().tiers(1).skipped_writes(), 0u);
}

TEST_F(CacheCoreEvictTest, BadScopesAreRefusedAndChangeNothing) {
  StartWithNvme(16, 1000);
  const auto a = Tokens(12);
  ASSERT_EQ(Store(a), 3u);
  DrainWrites();
  const v1::StatsResponse before = Stats();
  struct Case {
    const char* what;
    v1::EvictRequest req;
    StatusCode code;
  };
  v1::EvictRequest none, both = All(), tokens_with_all = All(), short_id, odd_tokens = Namespace(),
                         short_prefix = Prefix(Tokens(3)), unknown_ns;
  both.set_namespace_id(ns_wire_);
  tokens_with_all.set_tokens(PackTokens(Tokens(4)));
  short_id.set_namespace_id(ns_wire_.substr(0, 15));
  odd_tokens.set_tokens("abcde");
  unknown_ns.set_namespace_id(std::string(16, 'x'));
  unknown_ns.set_tokens(PackTokens(Tokens(4)));
  const Case cases[] = {
      {"no scope", none, StatusCode::kInvalidArgument},
      {"all and a namespace", both, StatusCode::kInvalidArgument},
      {"tokens with all", tokens_with_all, StatusCode::kInvalidArgument},
      {"a 15-byte namespace_id", short_id, StatusCode::kInvalidArgument},
      {"tokens of 5 bytes", odd_tokens, StatusCode::kInvalidArgument},
      {"a prefix shorter than a chunk", short_prefix, StatusCode::kInvalidArgument},
      {"a prefix of a namespace not open", unknown_ns, StatusCode::kNotFound},
  };
  for (const Case& c : cases) {
    v1::EvictResponse resp;
    const Status st = wire::Run(*core_, c.req, &resp);
    EXPECT_EQ(st.code(), c.code) << c.what << ": " << st.ToString();
    EXPECT_FALSE(st.message().empty()) << c.what;
  }
  EXPECT_EQ(Stats().DebugString(), before.DebugString());
  EXPECT_EQ(Lookup(a, false).num_chunks(), 3u);
}

TEST_F(CacheCoreEvictTest, HbmCopiesGoWithTheirDramChunks) {
  CacheCoreOptions o = Options(16);
  o.hbm.bytes = 8 * kSlotBytes;
  o.hbm.backend = HbmBackend::kHost;
  core_.reset();
  Start(o);
  const auto a = Tokens(12);
  ASSERT_EQ(Store(a), 3u);
  Lookup(a, false, 0, /*hbm=*/true);  // queues the copies into HBM
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (Chunks("hbm") < 3 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(Chunks("hbm"), 3u);
  auto r = Evict(Namespace());
  EXPECT_EQ(r["hbm"], Removal(3, 0));
  EXPECT_EQ(r["dram"], Removal(3, 0));
  EXPECT_EQ(r.count("nvme"), 0u) << "no NVMe tier here";
  EXPECT_EQ(Chunks("hbm"), 0u);
}

}  // namespace
}  // namespace kvtier::testing
