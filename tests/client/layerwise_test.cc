// LayerwiseLoader and LayerwiseStorer against a real kvtierd, on the gpu
// module's host emulation (device memory is host memory; each stream a thread).
// The expected bytes come from the vLLM flash-attn layout written out by hand
// here, not from the library's layout code.
#include "kvtier/layerwise.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstddef>
#include <cstring>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <thread>

#include "testing/daemon_process.h"

namespace kvtier {
namespace {

using testing::DaemonProcess;
using testing::TempDir;
using namespace std::chrono_literals;

constexpr int64_t kLayers = 4, kHeads = 2, kHeadDim = 16, kElem = 2;
constexpr int64_t kBlock = 4, kBlocks = 64, kChunkTokens = 16;
constexpr int64_t kTokenBytes = kHeads * kHeadDim * kElem;  // one plane, one token
constexpr int64_t kLayerTensorBytes =
    2 * kBlocks * kBlock * kTokenBytes;  // [2, blocks, block, H, D]

NamespaceSpec Spec() {
  NamespaceSpec s;
  s.model_id = "layerwise-test";
  s.kv_dtype = "fp16";
  s.layout = "mha";
  s.num_layers = kLayers;
  s.num_kv_heads = kHeads;
  s.head_dim = kHeadDim;
  s.chunk_tokens = kChunkTokens;
  return s;
}

// Byte offset of (plane p, token slot `slot` of block `block`) in a contiguous
// vLLM flash-attn layer tensor [2, num_blocks, block_size, heads, head_dim].
int64_t Offset(int64_t plane, int64_t block, int64_t slot) {
  return ((plane * kBlocks + block) * kBlock + slot) * kTokenBytes;
}

// A paged cache of kLayers device tensors.
struct Cache {
  std::vector<gpu::DeviceBuffer> tensors;
  PagedKvCache desc;

  void Init(gpu::Runtime& rt, gpu::Stream& s, uint32_t seed) {
    desc.layout = gpu::KvLayoutSpec::VllmFlashAttn(kBlocks, kBlock, kHeads, kHeadDim, kElem);
    tensors.resize(kLayers);
    desc.layers.resize(kLayers);
    std::mt19937 rng(seed);
    std::vector<uint8_t> bytes(kLayerTensorBytes);
    for (int64_t l = 0; l < kLayers; ++l) {
      ASSERT_TRUE(rt.Allocate(kLayerTensorBytes, &tensors[l]).ok());
      for (auto& b : bytes) b = seed == 0 ? 0 : static_cast<uint8_t>(rng());
      ASSERT_TRUE(rt.CopyAsync(tensors[l].data(), bytes.data(), bytes.size(), s).ok());
      ASSERT_TRUE(rt.Synchronize(s).ok());
      desc.layers[l].tensors[0] = tensors[l].data();
    }
  }
  const uint8_t* Token(int64_t layer, int64_t plane, std::span<const int32_t> table,
                       int64_t t) const {
    return static_cast<const uint8_t*>(tensors[layer].data()) +
           Offset(plane, table[t / kBlock], t % kBlock);
  }
};

// Whether tokens [0, tokens) of `layer` match between two caches and tables.
bool LayerMatches(const Cache& a, std::span<const int32_t> ta, const Cache& b,
                  std::span<const int32_t> tb, int64_t layer, int64_t tokens) {
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t p = 0; p < 2; ++p) {
      if (std::memcmp(a.Token(layer, p, ta, t), b.Token(layer, p, tb, t), kTokenBytes) != 0) {
        return false;
      }
    }
  }
  return true;
}

std::vector<int32_t> Table(size_t n, uint32_t seed) {
  std::vector<int32_t> ids(kBlocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(seed));
  ids.resize(n);
  return ids;
}

class LayerwiseTest : public ::testing::Test {
 protected:
  virtual std::vector<std::string> DaemonArgs() const { return {}; }
  void SetUp() override {
    DaemonProcess::Options o;
    o.socket_path = dir_.Sub("kvtierd.sock");
    o.extra_args = DaemonArgs();
    daemon_ = std::make_unique<DaemonProcess>(o);
    ASSERT_EQ(daemon_->Start(), "");
    ClientOptions co;
    co.socket_path = o.socket_path;
    co.deadline = 2000ms;
    auto c = Client::Connect(co);
    ASSERT_TRUE(c.ok());
    client_ = std::move(c).value();
    auto ns = client_->OpenNamespace(Spec());
    ASSERT_TRUE(ns.ok()) << ns.status().ToString();
    ns_ = *ns;
    gpu::HostRuntimeOptions ho;
    ho.inject_fault = [this](const void* p, size_t n) {
      std::lock_guard lock(fault_mu_);
      return fault_ && fault_(static_cast<const std::byte*>(p), n);
    };
    runtime_ = gpu::Runtime::CreateHost(ho);
    for (gpu::Stream* s : {&load_, &store_, &compute_}) {
      ASSERT_TRUE(runtime_->CreateStream(s).ok());
    }
    arena_ = std::make_unique<GpuArena>(*runtime_);
    tokens_.resize(3 * kChunkTokens + 5);
    std::iota(tokens_.begin(), tokens_.end(), 100);
  }
  void TearDown() override {
    arena_.reset();
    load_ = gpu::Stream();
    store_ = gpu::Stream();
    compute_ = gpu::Stream();
  }

  // Stores the prompt's 3 full chunks from `cache` (table `table`) layer by layer.
  Result<StoreResult> StoreAll(Cache& cache, std::span<const int32_t> table) {
    LayerwiseStorer storer(*client_, ns_, *arena_, cache.desc, *runtime_);
    auto n = storer.Start(tokens_, table, store_);
    if (!n.ok()) return n.status();
    EXPECT_EQ(*n, 3u);
    for (int64_t l = 0; l < kLayers; ++l) EXPECT_TRUE(storer.LayerDone(l, compute_).ok());
    return storer.Finish();
  }

  // Cache `a` with random KV (`seed`), an empty cache `b`, a block table for
  // each, and the prompt's 3 full chunks stored from `a`.
  void StorePrompt(uint32_t seed, Cache* a, Cache* b, std::vector<int32_t>* ta,
                   std::vector<int32_t>* tb) {
    ASSERT_NO_FATAL_FAILURE(a->Init(*runtime_, compute_, seed));
    ASSERT_NO_FATAL_FAILURE(b->Init(*runtime_, compute_, 0));
    *ta = Table(14, seed);
    *tb = Table(14, seed + 1);
    auto stored = StoreAll(*a, *ta);
    ASSERT_TRUE(stored.ok() && stored->stored_chunks == 3u);
  }
  // A to_hbm prefetch of the prompt, polled until nothing more goes into HBM.
  PrefetchTicket PrefetchIntoHbm() {
    PrefetchOptions po;
    po.to_hbm = true;
    auto ticket = client_->Prefetch(ns_, tokens_, po);
    EXPECT_TRUE(ticket.ok() && ticket->fail_open.ok());
    if (!ticket.ok()) return {};
    PrefetchProgress p = client_->PrefetchStatus(*ticket);
    for (int i = 0; i < 500 && !p.hbm_done; ++i, p = client_->PrefetchStatus(*ticket)) {
      std::this_thread::sleep_for(10ms);
    }
    EXPECT_EQ(p.hbm_chunks, 3u);
    return *ticket;
  }

  // The emulated attention of each layer l, queued on the compute stream after
  // WaitLayer(l): (*ready)[l] says whether layer l of `to` (table `tt`) held
  // the 3 chunks of `from` (table `tf`) when it started.
  void ComputeEachLayer(LayerwiseLoader& loader, const Cache& from, std::span<const int32_t> tf,
                        const Cache& to, std::span<const int32_t> tt, std::vector<int>* ready) {
    ready->assign(kLayers, -1);
    for (int64_t l = 0; l < kLayers; ++l) {
      ASSERT_TRUE(loader.WaitLayer(l, compute_).ok());
      ASSERT_TRUE(runtime_
                      ->LaunchHostFunc(compute_,
                                       [&, ready, l] {
                                         (*ready)[l] =
                                             LayerMatches(from, tf, to, tt, l, 3 * kChunkTokens);
                                       })
                      .ok());
    }
    ASSERT_TRUE(runtime_->Synchronize(compute_).ok());
  }

  nlohmann::json Stats() {
    auto r = daemon_->Ctl({"--json", "stats"});
    EXPECT_TRUE(r.ok()) << r.Describe();
    return nlohmann::json::parse(r.out, nullptr, false);
  }

  TempDir dir_{"kvtier-layerwise"};
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> client_;
  NamespaceHandle ns_;
  std::unique_ptr<gpu::Runtime> runtime_;
  gpu::Stream load_, store_, compute_;
  std::unique_ptr<GpuArena> arena_;
  std::vector<int32_t> tokens_;
  // Fails the emulated device's copies of the host ranges it returns true for.
  void FailCopies(std::function<bool(const std::byte*, size_t)> fn) {
    std::lock_guard lock(fault_mu_);
    fault_ = std::move(fn);
  }
  static bool Overlaps(std::span<const std::byte> r, const std::byte* p, size_t n) {
    return p < r.data() + r.size() && r.data() < p + n;
  }

  std::mutex fault_mu_;
  std::function<bool(const std::byte*, size_t)> fault_;  // GUARDED_BY(fault_mu_)
};

TEST_F(LayerwiseTest, StoreThenLoadMovesEveryElementAndComputeWaitsForEachLayer) {
  Cache a, b;
  ASSERT_NO_FATAL_FAILURE(a.Init(*runtime_, compute_, 7));
  ASSERT_NO_FATAL_FAILURE(b.Init(*runtime_, compute_, 0));
  const auto ta = Table(14, 1), tb = Table(14, 2);  // 53 tokens: 14 blocks of 4
  auto stored = StoreAll(a, ta);
  ASSERT_TRUE(stored.ok()) << stored.status().ToString();
  ASSERT_TRUE(stored->fail_open.ok()) << stored->fail_open.ToString();
  EXPECT_EQ(stored->stored_chunks, 3u);

  LayerwiseLoader loader(*client_, ns_, *arena_, b.desc, *runtime_);
  auto tokens = loader.StartLoad(tokens_, tb, load_);
  ASSERT_TRUE(tokens.ok()) << tokens.status().ToString();
  EXPECT_EQ(*tokens, 3u * kChunkTokens);
  std::vector<int> ready_at_compute;
  ASSERT_NO_FATAL_FAILURE(ComputeEachLayer(loader, a, ta, b, tb, &ready_at_compute));
  EXPECT_EQ(Stats()["active_leases"], 1) << "the lease is held until Finish";
  auto recompute = loader.Finish();
  ASSERT_TRUE(recompute.ok());
  EXPECT_TRUE(recompute->empty());
  for (int64_t l = 0; l < kLayers; ++l) {
    EXPECT_EQ(ready_at_compute[l], 1) << "layer " << l << " was not loaded when its compute began";
  }
  // The partial tail (tokens 48..52) is not loaded: block 12 of tb stays zero.
  const std::vector<uint8_t> zeros(kTokenBytes, 0);
  EXPECT_EQ(std::memcmp(b.Token(0, 0, tb, 48), zeros.data(), kTokenBytes), 0);
  nlohmann::json s = Stats();
  for (int i = 0; i < 50 && s["active_leases"] != 0; ++i, s = Stats())
    std::this_thread::sleep_for(20ms);
  EXPECT_EQ(s["active_leases"], 0);
}

TEST_F(LayerwiseTest, ChunksTheEngineAlreadyHoldsAreLeasedButNotCopied) {
  Cache a, b;
  std::vector<int32_t> ta, tb;
  ASSERT_NO_FATAL_FAILURE(StorePrompt(31, &a, &b, &ta, &tb));
  LayerwiseLoader loader(*client_, ns_, *arena_, b.desc, *runtime_);
  // The engine's prefix cache holds chunk 0 (num_computed_tokens = 16).
  ASSERT_EQ(*loader.StartLoad(tokens_, tb, load_, nullptr, /*first_chunk=*/1), 3u * kChunkTokens);
  for (int64_t l = 0; l < kLayers; ++l) ASSERT_TRUE(loader.WaitLayer(l, compute_).ok());
  ASSERT_TRUE(loader.Finish()->empty());
  const std::vector<uint8_t> zeros(kTokenBytes, 0);
  for (int64_t l = 0; l < kLayers; ++l) {
    for (int64_t t = 0; t < kChunkTokens; ++t) {  // chunk 0's blocks were not written
      ASSERT_EQ(std::memcmp(b.Token(l, 0, tb, t), zeros.data(), kTokenBytes), 0) << t;
    }
    for (int64_t t = kChunkTokens; t < 3 * kChunkTokens; ++t) {  // chunks 1 and 2 were
      ASSERT_EQ(std::memcmp(b.Token(l, 1, tb, t), a.Token(l, 1, ta, t), kTokenBytes), 0) << t;
    }
  }
  LayerwiseLoader all_held(*client_, ns_, *arena_, b.desc, *runtime_);
  EXPECT_EQ(*all_held.StartLoad(tokens_, tb, load_, nullptr, 5), 3u * kChunkTokens);
  EXPECT_TRUE(all_held.Finish()->empty());
  nlohmann::json s = Stats();
  for (int i = 0; i < 50 && s["active_leases"] != 0; ++i, s = Stats())
    std::this_thread::sleep_for(20ms);
  EXPECT_EQ(s["active_leases"], 0);
  EXPECT_GT(arena_->scratch().idle_bytes(), 0u)
      << "the load's device buffers went back to the arena";
}

TEST_F(LayerwiseTest, AFailedChunkCopyIsReportedWithItsBlockIdsAndTheRestLoads) {
  Cache a, b;
  ASSERT_NO_FATAL_FAILURE(a.Init(*runtime_, compute_, 9));
  ASSERT_NO_FATAL_FAILURE(b.Init(*runtime_, compute_, 0));
  const auto ta = Table(14, 3), tb = Table(14, 4);
  ASSERT_EQ(StoreAll(a, ta)->stored_chunks, 3u);
  {  // the arena bytes of chunk 1, where the emulated device will fail
    auto lease = client_->Acquire(ns_, tokens_);
    ASSERT_TRUE(lease.ok());
    ASSERT_EQ(lease->num_chunks(), 3u);
    FailCopies([chunk = lease->payload(1)](const std::byte* p, size_t n) {
      return Overlaps(chunk, p, n);
    });
  }
  LayerwiseLoader loader(*client_, ns_, *arena_, b.desc, *runtime_);
  ASSERT_EQ(*loader.StartLoad(tokens_, tb, load_), 3u * kChunkTokens);
  for (int64_t l = 0; l < kLayers; ++l) ASSERT_TRUE(loader.WaitLayer(l, compute_).ok());
  auto recompute = loader.Finish();
  ASSERT_TRUE(recompute.ok()) << "a copy failure is reported, not returned as an error";
  std::vector<int32_t> expected(tb.begin() + 4, tb.begin() + 8);  // chunk 1's blocks
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(*recompute, expected);
  for (int64_t l = 0; l < kLayers; ++l) {
    EXPECT_TRUE(LayerMatches(a, ta, b, tb, l, kChunkTokens)) << "chunk 0, layer " << l;
  }
}

TEST_F(LayerwiseTest, AStoreWithAFailedCopyCommitsNothing) {
  Cache a;
  ASSERT_NO_FATAL_FAILURE(a.Init(*runtime_, compute_, 11));
  const auto ta = Table(14, 5);
  {  // fail the 5th copy into the arena (one chunk of one layer)
    auto lease = client_->Acquire(ns_, tokens_);  // a miss, but it names the mapping
    ASSERT_TRUE(lease.ok());
    const std::shared_ptr<Arena> mapping = lease->mapping();
    ASSERT_NE(mapping, nullptr);
    const std::span<const std::byte> arena(mapping->base(), mapping->bytes());
    FailCopies([arena, count = 0](const std::byte* p, size_t n) mutable {
      return Overlaps(arena, p, n) && ++count == 5;
    });
  }
  auto r = StoreAll(a, ta);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->fail_open.ok());
  EXPECT_EQ(r->stored_chunks, 0u);
  EXPECT_EQ(client_->Lookup(ns_, tokens_)->num_chunks, 0u) << "nothing half-written is visible";
  EXPECT_EQ(Stats()["active_reservations"], 0);
}

TEST_F(LayerwiseTest, AStoreMissingALayerCommitsNothing) {
  Cache a;
  ASSERT_NO_FATAL_FAILURE(a.Init(*runtime_, compute_, 13));
  const auto ta = Table(14, 6);
  LayerwiseStorer storer(*client_, ns_, *arena_, a.desc, *runtime_);
  ASSERT_EQ(*storer.Start(tokens_, ta, store_), 3u);
  for (int64_t l = 0; l + 1 < kLayers; ++l) ASSERT_TRUE(storer.LayerDone(l, compute_).ok());
  auto r = storer.Finish();
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->fail_open.ok());
  EXPECT_EQ(client_->Lookup(ns_, tokens_)->num_chunks, 0u);
}

TEST_F(LayerwiseTest, ACacheThatDoesNotMatchTheNamespaceIsRefusedAndLeasesNothing) {
  Cache a;
  ASSERT_NO_FATAL_FAILURE(a.Init(*runtime_, compute_, 15));
  PagedKvCache wrong = a.desc;
  wrong.layout = gpu::KvLayoutSpec::VllmFlashAttn(kBlocks, kBlock, kHeads, kHeadDim / 2, kElem);
  LayerwiseLoader loader(*client_, ns_, *arena_, wrong, *runtime_);
  auto st = loader.StartLoad(tokens_, Table(14, 7), load_);
  EXPECT_EQ(st.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.status().message().find("payload"), std::string::npos) << st.status().message();
  PagedKvCache short_cache = a.desc;
  short_cache.layers.pop_back();
  LayerwiseStorer storer(*client_, ns_, *arena_, short_cache, *runtime_);
  auto st2 = storer.Start(tokens_, Table(14, 8), store_);
  EXPECT_EQ(st2.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st2.status().message().find("layers"), std::string::npos) << st2.status().message();
  LayerwiseStorer short_table(*client_, ns_, *arena_, a.desc, *runtime_);
  EXPECT_EQ(short_table.Start(tokens_, Table(5, 9), store_).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Stats()["active_leases"], 0);
  EXPECT_EQ(Stats()["active_reservations"], 0);
}

// Two KV cache groups (vLLM's hybrid allocator): layers 0-1 and 2-3, each with a
// block table of its own, and a sliding-window group that loads only the blocks
// its window needs (-1 for the rest).
TEST_F(LayerwiseTest, EachKvCacheGroupMovesThroughItsOwnBlockTable) {
  Cache a, b, c;
  ASSERT_NO_FATAL_FAILURE(a.Init(*runtime_, compute_, 17));
  ASSERT_NO_FATAL_FAILURE(b.Init(*runtime_, compute_, 0));
  ASSERT_NO_FATAL_FAILURE(c.Init(*runtime_, compute_, 0));
  a.desc.group_layers = b.desc.group_layers = {2, 2};
  const std::vector<std::vector<int32_t>> ta = {Table(14, 21), Table(14, 22)};
  LayerwiseStorer storer(*client_, ns_, *arena_, a.desc, *runtime_);
  ASSERT_EQ(*storer.Start(tokens_, ta, store_), 3u);
  for (int64_t l = 0; l < kLayers; ++l) ASSERT_TRUE(storer.LayerDone(l, compute_).ok());
  auto stored = storer.Finish();
  ASSERT_TRUE(stored.ok() && stored->fail_open.ok() && stored->stored_chunks == 3u);

  // Group 1 holds only chunks 1 and 2 (a window past chunk 0): chunk 0's blocks are -1.
  std::vector<std::vector<int32_t>> tb = {Table(14, 23), Table(14, 24)};
  std::fill(tb[1].begin(), tb[1].begin() + kChunkTokens / kBlock, gpu::kSkipBlock);
  // Layer l of b holds a's KV: every token of group 0, tokens 16-47 of group 1.
  auto loaded = [&](int64_t l) {
    const size_t g = static_cast<size_t>(l / 2);
    for (int64_t t = g == 0 ? 0 : kChunkTokens; t < 3 * kChunkTokens; ++t) {
      for (int64_t p = 0; p < 2; ++p) {
        if (std::memcmp(b.Token(l, p, tb[g], t), a.Token(l, p, ta[g], t), kTokenBytes) != 0) {
          return false;
        }
      }
    }
    return true;
  };
  LayerwiseLoader loader(*client_, ns_, *arena_, b.desc, *runtime_);
  ASSERT_EQ(*loader.StartLoad(tokens_, tb, load_), 3u * kChunkTokens);
  std::vector<int> ready(kLayers, -1);
  for (int64_t l = 0; l < kLayers; ++l) {
    ASSERT_TRUE(loader.WaitLayer(l, compute_).ok());
    ASSERT_TRUE(runtime_->LaunchHostFunc(compute_, [&, l] { ready[l] = loaded(l); }).ok());
  }
  ASSERT_TRUE(runtime_->Synchronize(compute_).ok());
  auto recompute = loader.Finish();
  ASSERT_TRUE(recompute.ok());
  EXPECT_TRUE(recompute->empty());
  for (int64_t l = 0; l < kLayers; ++l) {
    EXPECT_EQ(ready[l], 1) << "layer " << l << " was not loaded when its compute began";
  }
  const std::vector<uint8_t> zeros(kTokenBytes, 0);
  for (int64_t l = 2; l < kLayers; ++l) {  // group 1: only chunks 1 and 2's 8 blocks written
    size_t written = 0;
    for (int32_t block = 0; block < kBlocks; ++block) {
      const auto* base = static_cast<const uint8_t*>(b.tensors[l].data());
      bool nonzero = false;
      for (int64_t p = 0; p < 2 && !nonzero; ++p) {
        for (int64_t slot = 0; slot < kBlock && !nonzero; ++slot) {
          nonzero = std::memcmp(base + Offset(p, block, slot), zeros.data(), kTokenBytes) != 0;
        }
      }
      written += nonzero;
    }
    EXPECT_EQ(written, 8u) << "layer " << l;
  }

  // The payload holds group 0's layers, then group 1's: a one-group cache reads them so.
  const auto tc = Table(14, 25);
  LayerwiseLoader flat(*client_, ns_, *arena_, c.desc, *runtime_);
  ASSERT_EQ(*flat.StartLoad(tokens_, tc, load_), 3u * kChunkTokens);
  ASSERT_TRUE(flat.Finish()->empty());
  for (int64_t l = 0; l < kLayers; ++l) {
    EXPECT_TRUE(LayerMatches(a, ta[l / 2], c, tc, l, 3 * kChunkTokens)) << "payload layer " << l;
  }

  // A table per group, and groups that cover the layers, or a clear refusal.
  LayerwiseLoader one_table(*client_, ns_, *arena_, b.desc, *runtime_);
  auto st = one_table.StartLoad(tokens_, std::span<const int32_t>(tb[0]), load_);
  EXPECT_EQ(st.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.status().message().find("1 block tables for 2 KV cache groups"), std::string::npos)
      << st.status().message();
  PagedKvCache bad = b.desc;
  bad.group_layers = {3, 2};
  LayerwiseStorer bad_groups(*client_, ns_, *arena_, bad, *runtime_);
  auto st2 = bad_groups.Start(tokens_, ta, store_);
  EXPECT_EQ(st2.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st2.status().message().find("group_layers add up to 5"), std::string::npos)
      << st2.status().message();
  EXPECT_EQ(Stats()["active_leases"], 0);
  EXPECT_EQ(Stats()["active_reservations"], 0);
}

// The same daemon with an HBM tier on the host backend: the pool is shared
// host memory that GpuArena opens by its handle, as a CUDA client opens the
// daemon's pool with CUDA IPC.
class LayerwiseHbmTest : public LayerwiseTest {
 protected:
  std::vector<std::string> DaemonArgs() const override {
    return {"--hbm-bytes", "4MiB", "--gpu-backend", "host"};
  }
  nlohmann::json HbmStats() {
    const nlohmann::json stats = Stats();
    for (const auto& t : stats["tiers"]) {
      if (t["name"] == "hbm") return t;
    }
    ADD_FAILURE() << "no hbm tier in the stats";
    return {};
  }
};

TEST_F(LayerwiseHbmTest, TheSecondLoadCopiesFromHbmDeviceToDeviceAndMatchesEveryByte) {
  Cache a, b, c;
  ASSERT_NO_FATAL_FAILURE(a.Init(*runtime_, compute_, 21));
  ASSERT_NO_FATAL_FAILURE(b.Init(*runtime_, compute_, 0));
  ASSERT_NO_FATAL_FAILURE(c.Init(*runtime_, compute_, 0));
  const auto ta = Table(14, 11), tb = Table(14, 12), tc = Table(14, 13);
  ASSERT_EQ(StoreAll(a, ta)->stored_chunks, 3u);
  {  // the first load reads DRAM, and the daemon copies its hits into HBM
    LayerwiseLoader loader(*client_, ns_, *arena_, b.desc, *runtime_);
    ASSERT_EQ(*loader.StartLoad(tokens_, tb, load_), 3u * kChunkTokens);
    EXPECT_EQ(loader.hbm_chunks(), 0u);
    ASSERT_TRUE(loader.Finish()->empty());
  }
  nlohmann::json hbm = HbmStats();
  for (int i = 0; i < 500 && hbm["chunks"] != 3; ++i, hbm = HbmStats()) {
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_EQ(hbm["chunks"], 3) << hbm.dump();

  LayerwiseLoader loader(*client_, ns_, *arena_, c.desc, *runtime_);
  ASSERT_EQ(*loader.StartLoad(tokens_, tc, load_), 3u * kChunkTokens);
  EXPECT_EQ(loader.hbm_chunks(), 3u);
  std::vector<int> ready_at_compute;
  ASSERT_NO_FATAL_FAILURE(ComputeEachLayer(loader, a, ta, c, tc, &ready_at_compute));
  auto recompute = loader.Finish();
  ASSERT_TRUE(recompute.ok());
  EXPECT_TRUE(recompute->empty());
  for (int64_t l = 0; l < kLayers; ++l) {
    EXPECT_EQ(ready_at_compute[l], 1) << "layer " << l << " was not loaded when its compute began";
  }
  hbm = HbmStats();
  EXPECT_EQ(hbm["hits"], 3);
  EXPECT_GT(hbm["read_bytes"].get<uint64_t>(), 0u);
}

TEST_F(LayerwiseHbmTest, AnHbmSlotRewrittenDuringTheLoadIsReportedForRecompute) {
  Cache a, b;
  std::vector<int32_t> ta, tb;
  ASSERT_NO_FATAL_FAILURE(StorePrompt(27, &a, &b, &ta, &tb));
  const PrefetchTicket ticket = PrefetchIntoHbm();
  ASSERT_NE(ticket.id, 0u);
  // Where chunk 1's HBM copy lives, from a lease of our own.
  auto lease = client_->Acquire(ns_, tokens_, SIZE_MAX, nullptr, /*hbm=*/true);
  ASSERT_TRUE(lease.ok());
  ASSERT_EQ(lease->hbm_chunks, 3u);
  const uint64_t chunk1 = lease->hbm_payload_offset(1);
  lease->Release();
  // As a daemon would after a lapsed lease: the slot gets another image.
  gpu::DeviceBuffer pool;
  ASSERT_TRUE(
      runtime_->OpenExported(client_->HbmPool()->ipc_handle, client_->HbmPool()->pool_bytes, &pool)
          .ok());
  LayerwiseLoader loader(*client_, ns_, *arena_, b.desc, *runtime_);
  ASSERT_EQ(*loader.StartLoad(tokens_, tb, load_, &ticket), 3u * kChunkTokens);
  ASSERT_EQ(loader.hbm_chunks(), 3u);
  ASSERT_TRUE(runtime_->Synchronize(load_).ok());
  auto* sequence =
      reinterpret_cast<uint64_t*>(static_cast<std::byte*>(pool.data()) + chunk1 -
                                  ns_.layout.header_bytes + offsetof(SlotHeader, sequence));
  *sequence += 1000;
  auto recompute = loader.Finish();
  ASSERT_TRUE(recompute.ok());
  std::vector<int32_t> expected(tb.begin() + 4, tb.begin() + 12);  // chunks 1 and 2: a prefix ends
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(*recompute, expected);
  *sequence -= 1000;
}

TEST_F(LayerwiseHbmTest, AfterDaemonRestartsTheOldArenaAndPoolAreLetGo) {
  Cache a, b;
  ASSERT_NO_FATAL_FAILURE(a.Init(*runtime_, compute_, 29));
  ASSERT_NO_FATAL_FAILURE(b.Init(*runtime_, compute_, 0));
  const auto ta = Table(14, 20), tb = Table(14, 21);
  for (int run = 0; run < 3; ++run) {
    if (run > 0) {
      ASSERT_EQ(daemon_->Kill9().term_signal, SIGKILL);
      ASSERT_EQ(daemon_->Start(), "");
      ASSERT_TRUE(client_->OpenNamespace(Spec()).ok());
      for (int i = 0; i < 200 && !client_->HbmPool(); ++i) std::this_thread::sleep_for(10ms);
    }
    ASSERT_EQ(StoreAll(a, ta)->stored_chunks, 3u) << "run " << run;
    const PrefetchTicket ticket = PrefetchIntoHbm();
    ASSERT_NE(ticket.id, 0u) << "run " << run;
    LayerwiseLoader loader(*client_, ns_, *arena_, b.desc, *runtime_);
    ASSERT_EQ(*loader.StartLoad(tokens_, tb, load_, &ticket), 3u * kChunkTokens);
    EXPECT_EQ(loader.hbm_chunks(), 3u) << "run " << run;
    ASSERT_TRUE(loader.Finish()->empty());
    for (int64_t l = 0; l < kLayers; ++l) {
      EXPECT_TRUE(LayerMatches(a, ta, b, tb, l, 3 * kChunkTokens)) << "run " << run;
    }
    // This run's arena and pool, and at most the previous run's (its last
    // connection may not be torn down yet); never one per restart.
    EXPECT_LE(arena_->held_arenas(), 2u) << "run " << run;
    EXPECT_LE(arena_->held_pools(), 2u) << "run " << run;
  }
}

TEST_F(LayerwiseHbmTest, PrefetchToHbmMakesTheFirstLoadAnHbmLoad) {
  Cache a, b;
  std::vector<int32_t> ta, tb;
  ASSERT_NO_FATAL_FAILURE(StorePrompt(23, &a, &b, &ta, &tb));
  const PrefetchTicket ticket = PrefetchIntoHbm();
  ASSERT_NE(ticket.id, 0u);
  LayerwiseLoader loader(*client_, ns_, *arena_, b.desc, *runtime_);
  ASSERT_EQ(*loader.StartLoad(tokens_, tb, load_, &ticket), 3u * kChunkTokens);
  EXPECT_EQ(loader.hbm_chunks(), 3u);
  ASSERT_TRUE(loader.Finish()->empty());
  for (int64_t l = 0; l < kLayers; ++l) {
    EXPECT_TRUE(LayerMatches(a, ta, b, tb, l, 3 * kChunkTokens)) << "layer " << l;
  }
}

TEST_F(LayerwiseHbmTest, WaitCompleteWithToHbmWaitsForTheHbmCopiesToo) {
  Cache a, b;
  std::vector<int32_t> ta, tb;
  ASSERT_NO_FATAL_FAILURE(StorePrompt(33, &a, &b, &ta, &tb));
  PrefetchOptions po;
  po.to_hbm = true;
  po.policy = PrefetchPolicy::kWaitComplete;
  auto ticket = client_->Prefetch(ns_, tokens_, po);
  ASSERT_TRUE(ticket.ok() && ticket->fail_open.ok());
  // No polling here: the prefix is in DRAM already (the prefetch is done at
  // once), and the load must still wait for its copies into HBM.
  LayerwiseLoader loader(*client_, ns_, *arena_, b.desc, *runtime_);
  ASSERT_EQ(*loader.StartLoad(tokens_, tb, load_, &*ticket), 3u * kChunkTokens);
  EXPECT_EQ(loader.hbm_chunks(), 3u);
  ASSERT_TRUE(loader.Finish()->empty());
}

TEST_F(LayerwiseTest, PrefetchToHbmWithoutAnHbmTierFailsOpenAndTheLoadStillWorks) {
  Cache a, b;
  std::vector<int32_t> ta, tb;
  ASSERT_NO_FATAL_FAILURE(StorePrompt(25, &a, &b, &ta, &tb));
  PrefetchOptions po;
  po.to_hbm = true;
  auto ticket = client_->Prefetch(ns_, tokens_, po);
  ASSERT_TRUE(ticket.ok());
  EXPECT_EQ(ticket->fail_open.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(client_->connected()) << "a refused to_hbm is not a lost session";
  LayerwiseLoader loader(*client_, ns_, *arena_, b.desc, *runtime_);
  ASSERT_EQ(*loader.StartLoad(tokens_, tb, load_, &*ticket), 3u * kChunkTokens);
  EXPECT_EQ(loader.hbm_chunks(), 0u);
  ASSERT_TRUE(loader.Finish()->empty());
}

}  // namespace
}  // namespace kvtier
