// RemoteTier on real redis-server processes: images round trip verified, a
// value changed behind kvtier's back is a counted miss, a store that is down is
// a miss and then a degraded tier that probes in the background until the
// store is back.
#include "kvtier/tiers/remote_tier.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "slot_chain.h"
#include "testing/redis_servers.h"

namespace kvtier {
namespace {

using namespace std::chrono_literals;
using testing::RedisServers;

NamespaceSpec Spec(uint32_t chunk_tokens, uint32_t layers = 2) {
  NamespaceSpec s;
  s.model_id = "remote-test";
  s.num_layers = layers;
  s.num_kv_heads = 1;
  s.head_dim = 64;
  s.chunk_tokens = chunk_tokens;
  return s;
}

std::unique_ptr<RemoteTier> Open(const std::string& url, const std::string& mac_key = "") {
  RemoteTierOptions o;
  o.url = url;
  o.mac_key = mac_key;
  o.timeout = 200ms;
  o.probe_interval = 100ms;
  auto t = RemoteTier::Open(o);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(t).value() : nullptr;
}

// Reads every chunk of `chain` into fresh buffers; their results.
std::vector<Status> ReadAll(RemoteTier& tier, const Chain& chain,
                            std::vector<std::unique_ptr<AlignedBuf>>* out = nullptr) {
  std::vector<std::unique_ptr<AlignedBuf>> bufs;
  std::vector<RemoteTier::ReadRequest> reads;
  for (size_t i = 0; i < chain.images.size(); ++i) {
    bufs.push_back(std::make_unique<AlignedBuf>(chain.layout.slot_bytes));
    reads.push_back({chain.Id(i), &chain.layout, bufs.back()->span(), {}});
  }
  tier.ReadMany(reads);
  std::vector<Status> results;
  for (const auto& r : reads) results.push_back(r.result);
  if (out != nullptr) *out = std::move(bufs);
  return results;
}

class RemoteTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = RedisServers::StartSingle();
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    servers_ = std::move(s).value();
  }
  std::unique_ptr<RedisServers> servers_;
};

TEST_F(RemoteTierTest, ImagesOfEveryChunkSizeRoundTripVerified) {
  auto tier = Open(servers_->Url());
  ASSERT_NE(tier, nullptr);
  // Payloads of 8 KiB (16 tokens, 2 layers), 256 KiB, 1 MiB and 4 MiB (256 tokens, 4, 16, 64
  // layers).
  for (auto [tokens, layers] : {std::pair{16u, 2u}, {256u, 4u}, {256u, 16u}, {256u, 64u}}) {
    const Chain chain(Spec(tokens, layers), tokens + layers, 3);
    ASSERT_EQ(tier->WriteMany(chain.Images()), 3u);
    std::vector<std::unique_ptr<AlignedBuf>> bufs;
    for (const Status& st : ReadAll(*tier, chain, &bufs)) EXPECT_TRUE(st.ok()) << st.ToString();
    for (size_t i = 0; i < 3; ++i) {
      const uint64_t stored = chain.layout.header_bytes + chain.layout.payload_bytes;
      EXPECT_EQ(std::memcmp(bufs[i]->p, chain.images[i]->p, stored), 0) << "chunk " << i;
    }
  }
  const RemoteTierCounters c = tier->counters();
  EXPECT_EQ(c.writes, 12u);
  EXPECT_EQ(c.hits, 12u);
  EXPECT_EQ(c.corrupt_reads, 0u);
  EXPECT_FALSE(tier->cluster_mode());
}

TEST_F(RemoteTierTest, AnImageNotStoredIsAMissAndPresentRunStopsThere) {
  auto tier = Open(servers_->Url());
  ASSERT_NE(tier, nullptr);
  const Chain chain(Spec(16), 1, 4);
  std::vector<NvmeImage> images = chain.Images();
  images.erase(images.begin() + 2);  // chunk 2 never stored
  ASSERT_EQ(tier->WriteMany(images), 3u);
  const std::vector<Status> results = ReadAll(*tier, chain);
  EXPECT_TRUE(results[1].ok());
  EXPECT_EQ(results[2].code(), StatusCode::kNotFound) << results[2].ToString();
  EXPECT_EQ(tier->PresentRun(chain.ns, chain.keys), 2u);
  EXPECT_EQ(tier->counters().misses, 1u);
}

TEST_F(RemoteTierTest, AValueChangedBehindItsBackIsACountedMissNeverServed) {
  auto tier = Open(servers_->Url());
  ASSERT_NE(tier, nullptr);
  const Chain chain(Spec(16), 2, 5);
  ASSERT_EQ(tier->WriteMany(chain.Images()), 5u);
  const uint64_t stored = chain.layout.header_bytes + chain.layout.payload_bytes;
  // Chunk 0: one payload byte flipped. Chunk 1: a token changed (header
  // checksum). Chunk 2: cut short. Chunk 3: another chunk's image. Chunk 4:
  // a list, not a string (the store answers WRONGTYPE: up, but no image).
  const std::string list_key = RemoteTier::ImageKey(chain.ns, chain.keys[4]);
  ASSERT_TRUE(servers_->Run(0, {"DEL", list_key}).ok());
  ASSERT_TRUE(servers_->Run(0, {"RPUSH", list_key, "x"}).ok());
  std::string flipped(reinterpret_cast<const char*>(chain.images[0]->p), stored);
  flipped[chain.layout.header_bytes + 5] ^= 0x40;
  std::string token(reinterpret_cast<const char*>(chain.images[1]->p), stored);
  token[sizeof(SlotHeader)] ^= 0x01;
  const std::string shorter(reinterpret_cast<const char*>(chain.images[2]->p), stored - 4096);
  const std::string other(reinterpret_cast<const char*>(chain.images[0]->p), stored);
  const std::string values[] = {flipped, token, shorter, other};
  for (size_t i = 0; i < 4; ++i) {
    auto set = servers_->Run(0, {"SET", RemoteTier::ImageKey(chain.ns, chain.keys[i]), values[i]});
    ASSERT_TRUE(set.ok()) << set.status().ToString();
  }
  const std::vector<Status> results = ReadAll(*tier, chain);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(results[i].code(), StatusCode::kDataLoss) << i << ": " << results[i].ToString();
  }
  EXPECT_EQ(tier->counters().corrupt_reads, 5u);
  EXPECT_EQ(tier->counters().io_errors, 0u);
  EXPECT_EQ(tier->counters().hits, 0u);
}

// Issue 32, item 7: the checks above catch damage, not forgery. Whoever can
// write to the store can build an image that passes them all (every header
// field follows from the prompt and the namespace; the checksums are
// unkeyed): without a MAC key it is served. With one, only images sealed
// under the same key are: one planted without a MAC, or with a MAC under
// another key, is a counted miss, and daemons sharing the key read each
// other's images.
TEST_F(RemoteTierTest, WithAMacKeyOnlyImagesSealedUnderThatKeyAreServed) {
  const std::string key(32, 'k'), other_key(32, 'o');
  const Chain chain(Spec(16), 4, 3);
  const uint64_t stored = chain.layout.header_bytes + chain.layout.payload_bytes;
  // The forger's images: built from public data, planted straight into the store.
  for (size_t i = 0; i < 3; ++i) {
    const std::string forged(reinterpret_cast<const char*>(chain.images[i]->p), stored);
    ASSERT_TRUE(
        servers_->Run(0, {"SET", RemoteTier::ImageKey(chain.ns, chain.keys[i]), forged}).ok());
  }
  auto trusting = Open(servers_->Url());
  ASSERT_NE(trusting, nullptr);
  for (const Status& st : ReadAll(*trusting, chain)) {
    EXPECT_TRUE(st.ok()) << "without a key a well-formed planted image is served: "
                         << st.ToString();
  }
  auto keyed = Open(servers_->Url(), key);
  ASSERT_NE(keyed, nullptr);
  for (const Status& st : ReadAll(*keyed, chain)) {
    EXPECT_EQ(st.code(), StatusCode::kDataLoss) << "a planted image without a MAC was served";
  }
  // Sealed under another key (a daemon of another cluster, or a guessed key).
  auto foreign = Open(servers_->Url(), other_key);
  ASSERT_NE(foreign, nullptr);
  ASSERT_EQ(foreign->WriteMany(chain.Images()), 3u);
  for (const Status& st : ReadAll(*keyed, chain)) {
    EXPECT_EQ(st.code(), StatusCode::kDataLoss) << "an image under another key was served";
  }
  EXPECT_EQ(keyed->counters().corrupt_reads, 6u);
  EXPECT_EQ(keyed->counters().hits, 0u);
  // A daemon sharing the key: its images are served, byte for byte, to the other.
  auto peer = Open(servers_->Url(), key);
  ASSERT_NE(peer, nullptr);
  ASSERT_EQ(peer->WriteMany(chain.Images()), 3u);
  std::vector<std::unique_ptr<AlignedBuf>> bufs;
  const std::vector<Status> results = ReadAll(*keyed, chain, &bufs);
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(results[i].ok()) << i << ": " << results[i].ToString();
    EXPECT_EQ(std::memcmp(bufs[i]->p, chain.images[i]->p, stored), 0) << "chunk " << i;
    // The MAC read into the slot's padding is not left there.
    for (uint64_t b = stored; b < chain.layout.slot_bytes; ++b) {
      ASSERT_EQ(static_cast<const std::byte*>(bufs[i]->p)[b], std::byte{0}) << "byte " << b;
    }
  }
  // A layout whose image fills its slot to the byte (960 tokens: a 4096-byte
  // header): the MAC has no padding to land in, and is read beside it.
  const Chain full(Spec(960, 1), 5, 2);
  ASSERT_EQ(full.layout.header_bytes + full.layout.payload_bytes, full.layout.slot_bytes);
  ASSERT_EQ(peer->WriteMany(full.Images()), 2u);
  std::vector<std::unique_ptr<AlignedBuf>> full_bufs;
  const std::vector<Status> full_results = ReadAll(*keyed, full, &full_bufs);
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_TRUE(full_results[i].ok()) << i << ": " << full_results[i].ToString();
    EXPECT_EQ(std::memcmp(full_bufs[i]->p, full.images[i]->p, full.layout.slot_bytes), 0);
  }
  // One byte of a sealed value changed (here its MAC): a miss.
  auto value = servers_->Run(0, {"GET", RemoteTier::ImageKey(chain.ns, chain.keys[0])});
  ASSERT_TRUE(value.ok());
  std::string changed = value->str;
  ASSERT_EQ(changed.size(), stored + RemoteTierOptions::kMacBytes);
  changed[changed.size() - 1] ^= 0x01;
  ASSERT_TRUE(
      servers_->Run(0, {"SET", RemoteTier::ImageKey(chain.ns, chain.keys[0]), changed}).ok());
  EXPECT_EQ(ReadAll(*keyed, chain)[0].code(), StatusCode::kDataLoss);
}

TEST_F(RemoteTierTest, AStoreDownIsAMissThenDegradedUntilAProbeFindsItBack) {
  auto tier = Open(servers_->Url());
  ASSERT_NE(tier, nullptr);
  const Chain chain(Spec(16), 3, 2);
  servers_->StopAll();
  for (uint32_t i = 0; i < RemoteTier::kDegradedAfter; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    for (const Status& st : ReadAll(*tier, chain)) {
      EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  }
  EXPECT_TRUE(tier->Degraded());
  // Degraded: no call reaches the store, so even a long timeout costs nothing.
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(tier->WriteMany(chain.Images()), 0u);
  EXPECT_EQ(tier->PresentRun(chain.ns, chain.keys), 0u);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 50ms);
  EXPECT_GT(tier->counters().skipped, 0u);
  EXPECT_FALSE(tier->Probe().ok());
  ASSERT_TRUE(servers_->RestartStopped().ok());
  // A probe in the background (every probe_interval) finds it back, with no call made.
  bool back = false;
  for (auto until = std::chrono::steady_clock::now() + 10s;
       !back && std::chrono::steady_clock::now() < until;) {
    std::this_thread::sleep_for(50ms);
    back = !tier->Degraded();
  }
  EXPECT_TRUE(back) << "still degraded 10 s after the store came back";
  EXPECT_TRUE(tier->Probe().ok());
  EXPECT_EQ(tier->WriteMany(chain.Images()), 2u);
  for (const Status& st : ReadAll(*tier, chain)) EXPECT_TRUE(st.ok()) << st.ToString();
}

TEST_F(RemoteTierTest, AStoreDownAtStartStartsDegradedWithoutWaitingOnIt) {
  servers_->StopAll();
  RemoteTierOptions o;
  o.url = servers_->Url();
  o.timeout = 2000ms;  // long: a call that went to the store would show
  o.probe_interval = 100ms;
  auto tier = RemoteTier::Open(o);
  ASSERT_TRUE(tier.ok()) << tier.status().ToString();
  EXPECT_FALSE((*tier)->Degraded());  // Open connects to nothing
  EXPECT_EQ((*tier)->CheckAtStart().code(), StatusCode::kUnavailable);
  EXPECT_TRUE((*tier)->Degraded());
  const Chain chain(Spec(16), 5, 2);
  const auto t0 = std::chrono::steady_clock::now();
  for (const Status& st : ReadAll(**tier, chain)) EXPECT_FALSE(st.ok());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 100ms);
  ASSERT_TRUE(servers_->RestartStopped().ok());
  bool back = false;
  for (auto until = std::chrono::steady_clock::now() + 10s;
       !back && std::chrono::steady_clock::now() < until;) {
    std::this_thread::sleep_for(50ms);
    back = !(*tier)->Degraded();
  }
  EXPECT_TRUE(back);
  EXPECT_EQ((*tier)->WriteMany(chain.Images()), 2u);
}

TEST_F(RemoteTierTest, AFullStoreLosesTheWritesButIsNotDegradedAndKeepsServingReads) {
  auto tier = Open(servers_->Url());
  ASSERT_NE(tier, nullptr);
  const Chain stored(Spec(16), 5, 2);
  ASSERT_EQ(tier->WriteMany(stored.Images()), 2u);
  // Full: maxmemory below what it holds, and no eviction.
  ASSERT_TRUE(servers_->Run(0, {"CONFIG", "SET", "maxmemory-policy", "noeviction"}).ok());
  ASSERT_TRUE(servers_->Run(0, {"CONFIG", "SET", "maxmemory", "1"}).ok());
  const Chain more(Spec(16), 6, 2);
  for (uint32_t i = 0; i < 2 * RemoteTier::kDegradedAfter; ++i) {
    EXPECT_EQ(tier->WriteMany(more.Images()), 0u);
  }
  EXPECT_EQ(tier->counters().failed_writes, 4u * RemoteTier::kDegradedAfter);
  EXPECT_FALSE(tier->Degraded());
  for (const Status& st : ReadAll(*tier, stored)) EXPECT_TRUE(st.ok()) << st.ToString();
}

TEST(RemoteTierOptionsTest, BadSettingsAreNamed) {
  RemoteTierOptions o;
  o.url = "http://localhost:6379";
  auto t = RemoteTier::Open(o);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  o.url = "redis://localhost:6379";
  o.pool_size = 0;
  t = RemoteTier::Open(o);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("remote_pool_size"), std::string::npos)
      << t.status().ToString();
  o.pool_size = 4;
  o.timeout = 0ms;
  t = RemoteTier::Open(o);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("remote_timeout_ms"), std::string::npos);
}

TEST(RemoteTierClusterTest, ImagesSpreadOverEveryMasterAndReadBack) {
  auto servers = RedisServers::StartCluster({.num_masters = 3, .replicas_per_master = 0});
  ASSERT_TRUE(servers.ok()) << servers.status().ToString();
  auto tier = Open((*servers)->Url());
  ASSERT_NE(tier, nullptr);
  const Chain chain(Spec(16), 4, 32);
  ASSERT_EQ(tier->WriteMany(chain.Images()), 32u);
  for (const Status& st : ReadAll(*tier, chain)) EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(tier->cluster_mode());
  EXPECT_EQ(tier->Nodes().size(), 3u);
  for (size_t m = 0; m < 3; ++m) {  // every master holds some
    auto n = (*servers)->Run(m, {"DBSIZE"});
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    EXPECT_GT(n->integer, 0) << "master " << m;
  }
}

}  // namespace
}  // namespace kvtier
