// Tests of the client SDK (kvtier::Client) against a real kvtierd process.
// Each test starts its own daemon (64 MiB arena) on a socket in a fresh /tmp
// directory; DaemonProcess stops it even when an assertion fails.
#include "kvtier/client.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "gtest/gtest.h"
#include "kvtier/tools/model_presets.h"
#include "kvtier/tools/synthetic_kv.h"
#include "testing/daemon_process.h"
#include "tiny_prompts.h"

namespace kvtier {
namespace {

using testing::DaemonProcess;
using testing::kChunkTokens;
using testing::Payloads;
using testing::TempDir;
using testing::TinySpec;
using testing::Tokens;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

class ClientTest : public ::testing::Test {
 protected:
  ClientTest()
      : socket_(dir_.Sub("run/kvtierd.sock")), daemon_([&] {
          DaemonProcess::Options o;
          o.socket_path = socket_;
          o.dram_bytes = "64MiB";
          o.log_path = dir_.Sub("kvtierd.log");
          return o;
        }()) {}

  void SetUp() override { ASSERT_EQ(daemon_.Start(), ""); }
  void TearDown() override {
    if (HasFailure()) std::fprintf(stderr, "--- kvtierd log ---\n%s\n", daemon_.log().c_str());
  }

  // A connected client; the generous deadline keeps a loaded machine from
  // turning a slow call into a fail-open.
  std::unique_ptr<Client> Connect(std::chrono::milliseconds deadline = 2000ms,
                                  bool control_ring = true) {
    ClientOptions o;
    o.socket_path = socket_;
    o.control_ring = control_ring;
    o.deadline = deadline;
    o.connect_timeout = 5000ms;
    auto c = Client::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    if (!c.ok()) return nullptr;
    EXPECT_TRUE((*c)->connected());
    return std::move(c).value();
  }

  NamespaceHandle Open(Client& c, const NamespaceSpec& spec) {
    auto ns = c.OpenNamespace(spec);
    EXPECT_TRUE(ns.ok()) << ns.status().ToString();
    return ns.ok() ? *ns : NamespaceHandle{};
  }

  nlohmann::json Stats() {
    auto r = daemon_.Ctl({"--json", "stats"});
    EXPECT_TRUE(r.ok()) << r.Describe();
    return nlohmann::json::parse(r.out, nullptr, false);
  }

  // Stats once the client's queued lease releases (asynchronous, off the load
  // path) have reached the daemon: active_leases 0, or the last stats after 5 s.
  nlohmann::json StatsAfterReleases() {
    nlohmann::json s = Stats();
    for (auto until = Clock::now() + 5s; Clock::now() < until; s = Stats()) {
      if (!s.is_discarded() && s["active_leases"] == 0) break;
      std::this_thread::sleep_for(20ms);
    }
    return s;
  }

  TempDir dir_{"kvtier-client"};
  std::string socket_;
  DaemonProcess daemon_;
};

TEST_F(ClientTest, PrefetchHoldsTheCachedPrefixForTheLoadThatTakesItOver) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  const NamespaceHandle ns = Open(*client, TinySpec());
  const auto tokens = Tokens(7, 4 * kChunkTokens);
  const auto source = Payloads(ns, tokens);
  ASSERT_EQ(client->Store(ns, tokens, std::span<const std::byte>(source))->stored_chunks, 4u);

  for (PrefetchPolicy policy :
       {PrefetchPolicy::kBestEffort, PrefetchPolicy::kWaitComplete, PrefetchPolicy::kTimeout}) {
    PrefetchOptions po;
    po.policy = policy;
    auto ticket = client->Prefetch(ns, tokens, po);
    ASSERT_TRUE(ticket.ok()) << ticket.status().ToString();
    ASSERT_TRUE(ticket->fail_open.ok()) << ticket->fail_open.ToString();
    ASSERT_NE(ticket->id, 0u);
    EXPECT_EQ(ticket->total_chunks, 4u);
    EXPECT_EQ(ticket->ready_chunks, 4u) << "in DRAM already";
    EXPECT_EQ(ticket->nvme_chunks, 0u) << "this daemon has no NVMe tier";
    const PrefetchProgress progress = client->PrefetchStatus(*ticket);
    EXPECT_TRUE(progress.fail_open.ok()) << progress.fail_open.ToString();
    EXPECT_TRUE(progress.done);
    EXPECT_EQ(progress.ready_chunks, 4u);
    EXPECT_EQ(Stats()["active_prefetches"], 1);

    std::vector<std::byte> dest(source.size());
    auto ld = client->Load(ns, tokens, dest, &*ticket);
    ASSERT_TRUE(ld.ok()) << ld.status().ToString();
    EXPECT_TRUE(ld->fail_open.ok()) << ld->fail_open.ToString();
    EXPECT_EQ(ld->num_chunks, 4u);
    EXPECT_EQ(ld->prefetched_chunks, 0u) << "nothing had to come from NVMe";
    EXPECT_EQ(std::memcmp(dest.data(), source.data(), source.size()), 0);
    EXPECT_EQ(Stats()["active_prefetches"], 0) << "the load took the ticket over";
    EXPECT_EQ(client->PrefetchStatus(*ticket).fail_open.code(), StatusCode::kNotFound);
  }
  // Nothing cached: no ticket, and a Load given it is a plain load.
  const auto fresh = Tokens(8, 2 * kChunkTokens);
  auto none = client->Prefetch(ns, fresh);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->id, 0u);
  EXPECT_EQ(none->total_chunks, 0u);
  std::vector<std::byte> dest(2 * ns.layout.payload_bytes);
  EXPECT_EQ(client->Load(ns, fresh, dest, &*none)->num_chunks, 0u);
  // Bad options are the caller's error, and nothing reaches the daemon.
  PrefetchOptions bad;
  bad.deadline = 0ms;
  EXPECT_EQ(client->Prefetch(ns, tokens, bad).status().code(), StatusCode::kInvalidArgument);
  bad.deadline = 1000ms;
  bad.timeout_base = -1ms;
  EXPECT_EQ(client->Prefetch(ns, tokens, bad).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(StatsAfterReleases()["active_prefetches"], 0);
}

TEST_F(ClientTest, ReserveAndAcquireHoldTheirSlotsAcrossCalls) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  const NamespaceHandle ns = Open(*client, TinySpec());
  const auto tokens = Tokens(11, 3 * kChunkTokens + 5);
  const auto source = Payloads(ns, tokens);
  const uint64_t pb = ns.layout.payload_bytes;

  // A reservation dropped without a commit leaves nothing visible.
  {
    auto r = client->Reserve(ns, tokens);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->size(), 3u);
    EXPECT_EQ(Stats()["active_reservations"], 1);
  }
  EXPECT_EQ(Stats()["active_reservations"], 0) << "the destructor aborts";
  EXPECT_EQ(client->Lookup(ns, tokens)->num_chunks, 0u);

  // Chunk 0 was never stored: its children are dropped at once, never
  // orphans, and no slot is taken for them.
  auto orphans = client->Reserve(ns, tokens, /*first_chunk=*/1);
  ASSERT_TRUE(orphans.ok());
  EXPECT_EQ(orphans->size(), 0u);
  EXPECT_EQ(orphans->dropped_chunks, 2u);
  EXPECT_EQ(Stats()["active_reservations"], 0);

  // Written chunk by chunk, visible only at Commit.
  auto r = client->Reserve(ns, tokens);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->size(), 3u);
  EXPECT_EQ(r->chunk_index(1), 1u);
  EXPECT_EQ(r->chunk_index(2), 2u);
  for (size_t k = 0; k < r->size(); ++k) {
    std::memcpy(r->payload(k).data(), source.data() + r->chunk_index(k) * pb, pb);
  }
  EXPECT_EQ(client->Lookup(ns, tokens)->num_chunks, 0u) << "nothing visible before Commit";
  auto committed = r->Commit();
  ASSERT_TRUE(committed.ok());
  EXPECT_EQ(committed->stored_chunks, 3u);
  EXPECT_EQ(r->Commit().status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(client->Store(ns, tokens, std::span<const std::byte>(source))->already_stored_chunks,
            3u);
  auto lease = client->Acquire(ns, tokens);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(lease->fail_open.ok()) << lease->fail_open.ToString();
  ASSERT_EQ(lease->num_chunks(), 3u);
  EXPECT_EQ(Stats()["active_leases"], 1) << "held until released";
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(std::memcmp(lease->payload(i).data(), source.data() + i * pb, pb), 0) << i;
  }
  EXPECT_EQ(lease->ValidChunks(), 3u);
  lease->Release();
  EXPECT_EQ(StatsAfterReleases()["active_leases"], 0);
}

// A Store of chunks another client has reserved and not yet committed writes
// none of them and does not call them stored: they may never be (that client
// can still fail). They used to count as already stored.
TEST_F(ClientTest, ChunksAnotherClientIsWritingAreBeingWrittenNotAlreadyStored) {
  auto writer = Connect();
  auto other = Connect();
  ASSERT_TRUE(writer && other);
  const NamespaceHandle ns = Open(*writer, TinySpec());
  const NamespaceHandle other_ns = Open(*other, TinySpec());
  const auto tokens = Tokens(1, 3 * kChunkTokens);
  const auto source = Payloads(ns, tokens);
  auto held = writer->Reserve(ns, tokens);
  ASSERT_TRUE(held.ok() && held->size() == 3u);
  auto st = other->Store(other_ns, tokens, std::span<const std::byte>(source));
  ASSERT_TRUE(st.ok() && st->fail_open.ok());
  EXPECT_EQ(st->being_written_chunks, 3u);
  EXPECT_EQ(st->already_stored_chunks, 0u);
  EXPECT_EQ(st->stored_chunks, 0u);
  held->Abort();
  auto again = other->Store(other_ns, tokens, std::span<const std::byte>(source));
  ASSERT_TRUE(again.ok() && again->fail_open.ok());
  EXPECT_EQ(again->stored_chunks, 3u) << "the aborted reservation still holds the keys";
}

// A request id must be UTF-8 (a protobuf string): one that is not is refused
// by the SDK, naming request_id, on both paths. It was accepted over the
// control ring and, over gRPC, became an INTERNAL parse failure in kvtierd
// that the client reported as a fail-open.
TEST_F(ClientTest, ARequestIdThatIsNotUtf8IsRefusedOverTheRingAndGrpc) {
  for (const bool ring : {true, false}) {
    SCOPED_TRACE(ring ? "ring" : "gRPC");
    auto client = Connect(2000ms, ring);
    ASSERT_NE(client, nullptr);
    const NamespaceHandle ns = Open(*client, TinySpec());
    const auto tokens = Tokens(1, 2 * kChunkTokens);
    for (const std::string& id : {std::string("cmpl-\xff"), std::string("cmpl-\xc3")}) {
      auto l = client->Lookup(ns, tokens, id);
      ASSERT_FALSE(l.ok()) << "accepted; fail_open: " << l->fail_open.ToString();
      EXPECT_EQ(l.status().code(), StatusCode::kInvalidArgument);
      EXPECT_NE(l.status().message().find("request_id"), std::string::npos) << l.status().message();
      EXPECT_FALSE(client->Prefetch(ns, tokens, PrefetchOptions{}, id).ok());
    }
    auto fine = client->Lookup(ns, tokens, "cmpl-\xc3\xa9");  // é
    ASSERT_TRUE(fine.ok() && fine->fail_open.ok());
  }
}

TEST_F(ClientTest, StoreThenLoadReturnsTheSameBytes) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  const NamespaceHandle ns = Open(*client, TinySpec());
  const uint64_t pb = ns.layout.payload_bytes;
  ASSERT_EQ(pb, 512u * kChunkTokens);
  const auto tokens = Tokens(1, 5 * kChunkTokens + 3);
  const auto source = Payloads(ns, tokens);
  ASSERT_EQ(source.size(), 5 * pb);

  auto st = client->Store(ns, tokens, std::span<const std::byte>(source));
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_TRUE(st->fail_open.ok()) << st->fail_open.ToString();
  EXPECT_EQ(st->stored_chunks, 5u);
  EXPECT_EQ(st->already_stored_chunks, 0u);
  EXPECT_EQ(st->dropped_chunks, 0u);
  EXPECT_EQ(st->stored_bytes, 5 * pb);

  std::vector<std::byte> dest(5 * pb, std::byte{0xEE});
  auto ld = client->Load(ns, tokens, dest);
  ASSERT_TRUE(ld.ok()) << ld.status().ToString();
  EXPECT_TRUE(ld->fail_open.ok()) << ld->fail_open.ToString();
  EXPECT_EQ(ld->num_chunks, 5u);
  EXPECT_EQ(ld->loaded_tokens, 5u * kChunkTokens);
  EXPECT_EQ(std::memcmp(dest.data(), source.data(), source.size()), 0);

  // A destination for two chunks gets exactly the first two.
  std::vector<std::byte> small(2 * pb + pb / 2, std::byte{0});
  auto ld2 = client->Load(ns, tokens, small);
  ASSERT_TRUE(ld2.ok());
  EXPECT_EQ(ld2->num_chunks, 2u);
  EXPECT_EQ(std::memcmp(small.data(), source.data(), 2 * pb), 0);

  // Storing again writes nothing.
  auto again = client->Store(ns, tokens, std::span<const std::byte>(source));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->stored_chunks, 0u);
  EXPECT_EQ(again->already_stored_chunks, 5u);
  EXPECT_EQ(again->stored_bytes, 0u);

  // The loads released their leases.
  auto s = StatsAfterReleases();
  ASSERT_FALSE(s.is_discarded());
  EXPECT_EQ(s["active_leases"], 0);
  EXPECT_EQ(s["active_reservations"], 0);
  EXPECT_EQ(s["tiers"][0]["chunks"], 5);
}

TEST_F(ClientTest, LookupOfPromptWithPartialTailKeysOnlyFullChunks) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  const NamespaceHandle ns = Open(*client, TinySpec());
  const auto full = Tokens(2, 4 * kChunkTokens);
  // Store 2 full chunks plus a 7-token tail: only the 2 chunks are stored.
  std::vector<int32_t> with_tail(full.begin(), full.begin() + 2 * kChunkTokens + 7);
  EXPECT_EQ(Client::ChunkKeys(ns, with_tail).size(), 2u);
  auto st = client->Store(ns, with_tail, std::span<const std::byte>(Payloads(ns, with_tail)));
  ASSERT_TRUE(st.ok());
  EXPECT_TRUE(st->fail_open.ok());
  EXPECT_EQ(st->stored_chunks, 2u);

  auto l1 = client->Lookup(ns, with_tail);
  ASSERT_TRUE(l1.ok());
  EXPECT_TRUE(l1->fail_open.ok());
  EXPECT_EQ(l1->num_chunks, 2u);
  EXPECT_EQ(l1->cached_tokens, 2u * kChunkTokens);

  // The longer prompt whose third chunk starts with that tail: still 2 chunks.
  auto l2 = client->Lookup(ns, full);
  ASSERT_TRUE(l2.ok());
  EXPECT_EQ(l2->num_chunks, 2u);
  EXPECT_EQ(l2->cached_tokens, 2u * kChunkTokens);

  // A prompt of 1 chunk + tail: 1 chunk.
  std::vector<int32_t> short_tail(full.begin(), full.begin() + kChunkTokens + kChunkTokens - 1);
  auto l3 = client->Lookup(ns, short_tail);
  ASSERT_TRUE(l3.ok());
  EXPECT_EQ(l3->cached_tokens, 1u * kChunkTokens);

  // A prompt that differs in its first token shares nothing (chained keys).
  auto other = with_tail;
  other[0] ^= 1;
  auto l4 = client->Lookup(ns, other);
  ASSERT_TRUE(l4.ok());
  EXPECT_TRUE(l4->fail_open.ok());
  EXPECT_EQ(l4->cached_tokens, 0u);
}

TEST_F(ClientTest, PromptShorterThanAChunkIsAZeroTokenMiss) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  const NamespaceHandle ns = Open(*client, TinySpec());
  for (size_t n : {size_t{0}, size_t{1}, size_t{kChunkTokens - 1}}) {
    SCOPED_TRACE("prompt of " + std::to_string(n) + " tokens");
    const auto tokens = Tokens(3, n);
    EXPECT_TRUE(Client::ChunkKeys(ns, tokens).empty());
    auto st = client->Store(ns, tokens, std::span<const std::byte>());
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    EXPECT_TRUE(st->fail_open.ok());
    EXPECT_EQ(st->stored_chunks + st->dropped_chunks + st->already_stored_chunks, 0u);
    auto l = client->Lookup(ns, tokens);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    EXPECT_TRUE(l->fail_open.ok()) << l->fail_open.ToString();
    EXPECT_EQ(l->cached_tokens, 0u);
    EXPECT_EQ(l->num_chunks, 0u);
    std::vector<std::byte> dest(ns.layout.payload_bytes);
    auto ld = client->Load(ns, tokens, dest);
    ASSERT_TRUE(ld.ok());
    EXPECT_EQ(ld->loaded_tokens, 0u);
  }
  auto s = Stats();
  ASSERT_FALSE(s.is_discarded());
  EXPECT_EQ(s["tiers"][0]["chunks"], 0);
}

TEST_F(ClientTest, OpenNamespaceWithBadSpecIsInvalidArgumentNamingTheField) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  struct Case {
    std::function<void(NamespaceSpec&)> mutate;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](NamespaceSpec& s) { s.model_id = ""; }, "model_id"},
      {[](NamespaceSpec& s) { s.kv_dtype = "fp12"; }, "kv_dtype"},
      {[](NamespaceSpec& s) { s.num_layers = 0; }, "num_layers"},
      {[](NamespaceSpec& s) { s.chunk_tokens = 0; }, "chunk_tokens"},
      {[](NamespaceSpec& s) { s.layout = "gqa"; }, "layout"},
      {[](NamespaceSpec& s) { s.head_dim = 0; }, "head_dim"},
      {[](NamespaceSpec& s) { s.tp_rank = 2, s.tp_size = 2; }, "tp_rank"},
      {[](NamespaceSpec& s) { s.cache_salt = "a|b"; }, "cache_salt"},
  };
  for (const Case& c : cases) {
    NamespaceSpec spec = TinySpec();
    c.mutate(spec);
    auto ns = client->OpenNamespace(spec);
    ASSERT_FALSE(ns.ok()) << c.field;
    EXPECT_EQ(ns.status().code(), StatusCode::kInvalidArgument) << ns.status().ToString();
    EXPECT_NE(ns.status().message().find(c.field), std::string::npos)
        << "'" << ns.status().message() << "' does not name " << c.field;
  }
  // Valid by itself, but one slot is larger than the daemon's 64 MiB arena:
  // the daemon's INVALID_ARGUMENT reaches the caller.
  auto big = tools::ModelPreset("llama3-8b", 1024);  // 128 MiB per chunk
  ASSERT_TRUE(big.ok());
  auto ns = client->OpenNamespace(*big);
  ASSERT_FALSE(ns.ok());
  EXPECT_EQ(ns.status().code(), StatusCode::kInvalidArgument) << ns.status().ToString();
  EXPECT_NE(ns.status().message().find("arena"), std::string::npos) << ns.status().message();

  // Nothing was registered by the failures.
  auto r = daemon_.Ctl({"--json", "namespaces"});
  ASSERT_TRUE(r.ok()) << r.Describe();
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j["namespaces"].size(), 0u) << j.dump();
}

TEST_F(ClientTest, CallsWithANamespaceNotOpenedByThisClientAreInvalidArgument) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  const NamespaceSpec spec = TinySpec();
  NamespaceHandle forged{spec.Digest(), spec, SlotLayout::For(spec)};
  const auto tokens = Tokens(4, 2 * kChunkTokens);
  auto l = client->Lookup(forged, tokens);
  EXPECT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), StatusCode::kInvalidArgument);
  std::vector<std::byte> dest(2 * forged.layout.payload_bytes);
  auto ld = client->Load(forged, tokens, dest);
  EXPECT_FALSE(ld.ok());
  EXPECT_EQ(ld.status().code(), StatusCode::kInvalidArgument);
}

TEST_F(ClientTest, StoreWithTooShortSourceIsInvalidArgumentAndStoresNothing) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  const NamespaceHandle ns = Open(*client, TinySpec());
  const auto tokens = Tokens(5, 3 * kChunkTokens + 1);
  auto source = Payloads(ns, tokens);
  source.pop_back();  // one byte short
  auto st = client->Store(ns, tokens, std::span<const std::byte>(source));
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.status().code(), StatusCode::kInvalidArgument) << st.status().ToString();
  EXPECT_NE(st.status().message().find("source"), std::string::npos) << st.status().message();
  auto l = client->Lookup(ns, tokens);
  ASSERT_TRUE(l.ok());
  EXPECT_TRUE(l->fail_open.ok());
  EXPECT_EQ(l->cached_tokens, 0u);
  auto s = Stats();
  ASSERT_FALSE(s.is_discarded());
  EXPECT_EQ(s["active_reservations"], 0);
  EXPECT_EQ(s["tiers"][0]["used_bytes"], 0);
}

TEST_F(ClientTest, FailedWriterAbortsTheWholeWriteAndNothingBecomesVisible) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  const NamespaceHandle ns = Open(*client, TinySpec());
  const auto tokens = Tokens(6, 4 * kChunkTokens);
  auto st = client->Store(ns, tokens, [](size_t i, std::span<std::byte> p) {
    std::memset(p.data(), 0x5A, p.size());
    return i == 2 ? Status::Internal("GPU copy failed") : Status::Ok();
  });
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.status().code(), StatusCode::kInternal);
  auto l = client->Lookup(ns, tokens);
  ASSERT_TRUE(l.ok());
  EXPECT_TRUE(l->fail_open.ok());
  EXPECT_EQ(l->cached_tokens, 0u);
  auto s = Stats();
  ASSERT_FALSE(s.is_discarded());
  EXPECT_EQ(s["active_reservations"], 0);
  EXPECT_EQ(s["tiers"][0]["used_bytes"], 0);
  EXPECT_EQ(s["tiers"][0]["chunks"], 0);
}

TEST_F(ClientTest, DifferentCacheSaltIsADifferentNamespace) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  const NamespaceHandle a = Open(*client, TinySpec("tenant-a"));
  const NamespaceHandle b = Open(*client, TinySpec("tenant-b"));
  const NamespaceHandle none = Open(*client, TinySpec(""));
  ASSERT_NE(a.id, b.id);
  ASSERT_NE(a.id, none.id);
  const auto tokens = Tokens(7, 3 * kChunkTokens);
  EXPECT_NE(Client::ChunkKeys(a, tokens)[0], Client::ChunkKeys(b, tokens)[0]);

  auto st = client->Store(a, tokens, std::span<const std::byte>(Payloads(a, tokens)));
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->stored_chunks, 3u);

  auto la = client->Lookup(a, tokens);
  ASSERT_TRUE(la.ok());
  EXPECT_EQ(la->cached_tokens, 3u * kChunkTokens);
  for (const NamespaceHandle* other : {&b, &none}) {
    auto l = client->Lookup(*other, tokens);
    ASSERT_TRUE(l.ok());
    EXPECT_TRUE(l->fail_open.ok()) << l->fail_open.ToString();
    EXPECT_EQ(l->cached_tokens, 0u) << other->spec.cache_salt;
    std::vector<std::byte> dest(3 * other->layout.payload_bytes);
    auto ld = client->Load(*other, tokens, dest);
    ASSERT_TRUE(ld.ok());
    EXPECT_EQ(ld->loaded_tokens, 0u);
  }
  // A second client process-side (same process here) opening tenant-a sees it.
  auto client2 = Connect();
  ASSERT_NE(client2, nullptr);
  const NamespaceHandle a2 = Open(*client2, TinySpec("tenant-a"));
  auto l2 = client2->Lookup(a2, tokens);
  ASSERT_TRUE(l2.ok());
  EXPECT_EQ(l2->cached_tokens, 3u * kChunkTokens);
  // The salt is a tenant's secret: the daemon's log says a namespace has one,
  // never what it is. (Stopped first: its log is written in blocks.)
  daemon_.Stop();
  const std::string log = daemon_.log();
  EXPECT_NE(log.find("namespace " + a.id.ToHex() + " opened"), std::string::npos) << log;
  EXPECT_EQ(log.find("tenant-a"), std::string::npos) << log;
  EXPECT_EQ(log.find("tenant-b"), std::string::npos) << log;
}

TEST_F(ClientTest, ConcurrentStoreAndLoadFromFourThreadsOfOneClient) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  const NamespaceHandle ns = Open(*client, TinySpec());
  const uint64_t pb = ns.layout.payload_bytes;
  constexpr int kThreads = 4, kIterations = 40;
  std::atomic<uint64_t> verify_errors{0}, loaded{0}, fail_open{0}, api_errors{0};
  std::vector<std::thread> threads;
  const auto shared_prefix = Tokens(100, 2 * kChunkTokens);  // every thread stores and loads it
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int it = 0; it < kIterations; ++it) {
        std::vector<int32_t> tokens = shared_prefix;
        const auto own = Tokens(1000 + t * 100 + it % 10, (1 + it % 4) * kChunkTokens + it % 5);
        tokens.insert(tokens.end(), own.begin(), own.end());
        const auto keys = Client::ChunkKeys(ns, tokens);
        auto st = client->Store(ns, tokens, [&](size_t i, std::span<std::byte> p) {
          tools::FillPayload(keys[i], ns.spec.num_layers, p);
          return Status::Ok();
        });
        if (!st.ok())
          ++api_errors;
        else if (!st->fail_open.ok())
          ++fail_open;
        std::vector<std::byte> dest(keys.size() * pb);
        auto ld = client->Load(ns, tokens, dest);
        if (!ld.ok()) {
          ++api_errors;
          continue;
        }
        if (!ld->fail_open.ok()) ++fail_open;
        for (uint32_t i = 0; i < ld->num_chunks; ++i) {
          if (tools::CountPayloadErrors(keys[i], ns.spec.num_layers,
                                        std::span<const std::byte>(dest.data() + i * pb, pb)) !=
              0) {
            ++verify_errors;
          }
        }
        loaded += ld->num_chunks;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(verify_errors.load(), 0u);
  EXPECT_EQ(api_errors.load(), 0u);
  EXPECT_EQ(fail_open.load(), 0u);
  // The arena holds everything: every load after a store finds at least the
  // shared prefix (another thread may still be writing a shared chunk).
  EXPECT_GE(loaded.load(), uint64_t{kThreads} * kIterations);
  auto s = StatsAfterReleases();
  ASSERT_FALSE(s.is_discarded());
  EXPECT_EQ(s["active_leases"], 0);
  EXPECT_EQ(s["active_reservations"], 0);
  EXPECT_EQ(s["sessions"], 1);
}

TEST_F(ClientTest, CloseEndsTheSessionAndLaterCallsFailOpen) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  const NamespaceHandle ns = Open(*client, TinySpec());
  auto s1 = Stats();
  ASSERT_FALSE(s1.is_discarded());
  EXPECT_EQ(s1["sessions"], 1);
  client->Close();
  EXPECT_FALSE(client->connected());
  bool ended = false;
  const auto deadline = Clock::now() + 5s;
  while (!ended && Clock::now() < deadline) {
    auto s = Stats();
    ended = !s.is_discarded() && s["sessions"] == 0;
    if (!ended) std::this_thread::sleep_for(20ms);
  }
  EXPECT_TRUE(ended) << "the daemon still counts the closed client's session";
  auto l = client->Lookup(ns, Tokens(8, 2 * kChunkTokens));
  ASSERT_TRUE(l.ok());
  EXPECT_FALSE(l->fail_open.ok());
  EXPECT_EQ(l->cached_tokens, 0u);
}

// Without a daemon: Connect succeeds, calls fail open with a reason and
// within the deadline; once a daemon appears the client uses it by itself.
class ClientNoDaemonTest : public ::testing::Test {
 protected:
  TempDir dir_{"kvtier-client"};
};

TEST_F(ClientNoDaemonTest, ConnectSucceedsAndCallsFailOpenUntilADaemonAppears) {
  const std::string socket = dir_.Sub("run/kvtierd.sock");
  ClientOptions o;
  o.socket_path = socket;
  o.deadline = 100ms;
  o.connect_timeout = 500ms;
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto& client = *c;
  EXPECT_FALSE(client->connected());
  auto ns_or = client->OpenNamespace(TinySpec());
  ASSERT_TRUE(ns_or.ok()) << ns_or.status().ToString();
  const NamespaceHandle ns = *ns_or;
  const auto tokens = Tokens(9, 3 * kChunkTokens + 2);

  const auto t0 = Clock::now();
  auto l = client->Lookup(ns, tokens);
  const auto lookup_ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->cached_tokens, 0u);
  EXPECT_FALSE(l->fail_open.ok());
  EXPECT_FALSE(l->fail_open.message().empty());
  EXPECT_LT(lookup_ms.count(), 1000);
  std::printf("fail-open Lookup without a daemon: %lld ms, reason: %s\n",
              static_cast<long long>(lookup_ms.count()), l->fail_open.ToString().c_str());

  auto st = client->Store(ns, tokens, std::span<const std::byte>(Payloads(ns, tokens)));
  ASSERT_TRUE(st.ok());
  EXPECT_FALSE(st->fail_open.ok());
  EXPECT_EQ(st->stored_chunks, 0u);
  EXPECT_EQ(st->dropped_chunks, 3u);
  std::vector<std::byte> dest(3 * ns.layout.payload_bytes);
  auto ld = client->Load(ns, tokens, dest);
  ASSERT_TRUE(ld.ok());
  EXPECT_FALSE(ld->fail_open.ok());
  EXPECT_EQ(ld->loaded_tokens, 0u);

  // A bad spec is still the caller's error, daemon or not.
  NamespaceSpec bad = TinySpec();
  bad.num_layers = 0;
  auto bad_ns = client->OpenNamespace(bad);
  ASSERT_FALSE(bad_ns.ok());
  EXPECT_EQ(bad_ns.status().code(), StatusCode::kInvalidArgument);

  DaemonProcess::Options opts;
  opts.socket_path = socket;
  opts.log_path = dir_.Sub("kvtierd.log");
  DaemonProcess daemon(opts);
  ASSERT_EQ(daemon.Start(), "");
  bool stored = false;
  const auto deadline = Clock::now() + 15s;
  while (!stored && Clock::now() < deadline) {
    auto s = client->Store(ns, tokens, std::span<const std::byte>(Payloads(ns, tokens)));
    stored = s.ok() && s->fail_open.ok() && s->stored_chunks == 3;
    if (!stored) std::this_thread::sleep_for(50ms);
  }
  ASSERT_TRUE(stored) << "the client did not connect within 15 s of the daemon starting\n"
                      << daemon.log();
  EXPECT_TRUE(client->connected());
  auto ld2 = client->Load(ns, tokens, dest);
  ASSERT_TRUE(ld2.ok());
  EXPECT_TRUE(ld2->fail_open.ok());
  EXPECT_EQ(ld2->num_chunks, 3u);
  EXPECT_EQ(std::memcmp(dest.data(), Payloads(ns, tokens).data(), dest.size()), 0);
}

}  // namespace
}  // namespace kvtier
