// CacheCore's KV events (cache_core_events.cc) in process, with a sink that
// records: HBM copies and their removal when DRAM evicts, an engine-keyed
// namespace's chunks (no tokens, no parent), and no events once the sink is unset.
#include <gtest/gtest.h>

#include <mutex>
#include <thread>

#include "daemon/cache_core_harness.h"

namespace kvtier::testing {
namespace {

using namespace std::chrono_literals;

class RecordingSink : public KvEventSink {
 public:
  void Add(KvEvent event) override {
    std::lock_guard lock(mu_);
    events_.push_back(std::move(event));
  }
  std::vector<KvEvent> Events() {
    std::lock_guard lock(mu_);
    return events_;
  }
  std::vector<KvEvent> Of(KvEventType type, KvMedium medium) {
    std::vector<KvEvent> out;
    for (const KvEvent& e : Events()) {
      if (e.type == type && e.medium == medium) out.push_back(e);
    }
    return out;
  }

 private:
  std::mutex mu_;
  std::vector<KvEvent> events_;
};

class CacheCoreEventsTest : public ::testing::Test, public CacheCoreDriver {
 protected:
  void TearDown() override {
    if (core_) core_->SetKvEventSink(nullptr);
    core_.reset();
  }
  RecordingSink sink_;
};

TEST_F(CacheCoreEventsTest, HbmCopiesAreStoredOnTheGpuAndGoWhenDramEvicts) {
  CacheCoreOptions o = Options(/*num_slots=*/4);
  o.hbm.bytes = 8 * kSlotBytes;
  o.hbm.backend = HbmBackend::kHost;
  ASSERT_NO_FATAL_FAILURE(Start(o));
  core_->SetKvEventSink(&sink_);
  ASSERT_EQ(sink_.Events().size(), 1u);
  EXPECT_EQ(sink_.Events()[0].type, KvEventType::kAllBlocksCleared);

  const auto t = Tokens(3 * kChunkTokens);
  const auto keys = Keys(t);
  ASSERT_EQ(Store(t), 3u);
  Lookup(t, false, 0, /*hbm=*/true);  // queues the copies into HBM
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (sink_.Of(KvEventType::kBlockStored, KvMedium::kGpu).size() < 3 &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(1ms);
  }
  const auto gpu = sink_.Of(KvEventType::kBlockStored, KvMedium::kGpu);
  ASSERT_EQ(gpu.size(), 3u);
  for (const KvEvent& e : gpu) {
    const size_t i = std::find(keys.begin(), keys.end(), e.block_hashes.at(0)) - keys.begin();
    ASSERT_LT(i, keys.size());
    EXPECT_EQ(e.parent, i == 0 ? std::nullopt : std::optional<ChunkKey>(keys[i - 1]));
    EXPECT_EQ(e.token_ids, std::vector<int32_t>(t.begin() + i * kChunkTokens,
                                                t.begin() + (i + 1) * kChunkTokens))
        << "tokens from the DRAM copy";
    EXPECT_EQ(e.block_size, kChunkTokens);
  }
  // 3 more chunks into 4 DRAM slots: DRAM evicts, and each DRAM victim's HBM copy goes too.
  ASSERT_EQ(Store(Tokens(3 * kChunkTokens, 1000)), 3u);
  const auto dram_gone = sink_.Of(KvEventType::kBlockRemoved, KvMedium::kCpu);
  const auto gpu_gone = sink_.Of(KvEventType::kBlockRemoved, KvMedium::kGpu);
  ASSERT_FALSE(dram_gone.empty());
  ASSERT_EQ(gpu_gone.size(), dram_gone.size());
  for (size_t i = 0; i < gpu_gone.size(); ++i) {
    EXPECT_EQ(gpu_gone[i].block_hashes, dram_gone[i].block_hashes);
  }
}

TEST_F(CacheCoreEventsTest, EngineKeyedChunksHaveNoTokensAndNoParent) {
  ASSERT_NO_FATAL_FAILURE(Start(Options(16), nullptr, /*engine_keyed=*/true));
  core_->SetKvEventSink(&sink_);
  const auto t = Tokens(3 * 8);
  ASSERT_EQ(Store(t), 3u);
  const auto stored = sink_.Of(KvEventType::kBlockStored, KvMedium::kCpu);
  ASSERT_EQ(stored.size(), 3u);
  for (const KvEvent& e : stored) {
    EXPECT_FALSE(e.parent.has_value());
    EXPECT_TRUE(e.token_ids.empty()) << "the token area holds the engine's hash, not tokens";
    EXPECT_EQ(e.block_size, 8u);
  }
}

TEST_F(CacheCoreEventsTest, NoEventsOnceTheSinkIsUnset) {
  ASSERT_NO_FATAL_FAILURE(Start(Options(16)));
  core_->SetKvEventSink(&sink_);
  ASSERT_EQ(Store(Tokens(2 * kChunkTokens)), 2u);
  const size_t before = sink_.Events().size();
  EXPECT_EQ(before, 3u);  // AllBlocksCleared and two BlockStored
  core_->SetKvEventSink(nullptr);
  ASSERT_EQ(Store(Tokens(2 * kChunkTokens, 500)), 2u);
  EXPECT_EQ(sink_.Events().size(), before);
}

}  // namespace
}  // namespace kvtier::testing
