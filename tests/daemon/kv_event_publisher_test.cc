// KvEventPublisher on ipc:// in a temp dir, read with the tools' subscriber:
// batches in order with sequence numbers from 0, a full queue drops and
// leaves a gap that the replay cannot fill, replay from a start point.
#include "kvtier/daemon/kv_event_publisher.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "kvtier/tools/kv_event_subscriber.h"
#include "testing/daemon_process.h"

namespace kvtier {
namespace {

using namespace std::chrono_literals;
using tools::KvEventSubscriber;

KvEvent Stored(uint64_t n) {
  KvEvent e;
  e.type = KvEventType::kBlockStored;
  e.medium = KvMedium::kCpu;
  e.block_hashes = {ChunkKey{n, 0}};
  e.token_ids = {static_cast<int32_t>(n)};
  e.block_size = 1;
  return e;
}

struct Fixture {
  explicit Fixture(KvEventPublisherOptions o) {
    o.address = "ipc://" + dir.Sub("events");
    o.replay_address = "ipc://" + dir.Sub("replay");
    auto p = KvEventPublisher::Create(o);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    if (p.ok()) publisher = std::move(p).value();
    auto s = KvEventSubscriber::Connect(o.address, o.replay_address);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (s.ok()) sub = std::move(s).value();
    std::this_thread::sleep_for(200ms);  // the SUB connection comes up asynchronously
  }
  testing::TempDir dir{"kvtier-events"};
  std::unique_ptr<KvEventPublisher> publisher;
  std::unique_ptr<KvEventSubscriber> sub;
};

TEST(KvEventPublisher, BatchesComeInOrderWithSequencesFromZero) {
  KvEventPublisherOptions o;
  o.batch_events = 2;
  o.flush_interval = 200ms;  // all five below go in one flush: batches of 2, 2, 1
  Fixture f(o);
  ASSERT_TRUE(f.publisher && f.sub);
  for (uint64_t i = 0; i < 5; ++i) f.publisher->Add(Stored(i));
  std::vector<uint64_t> seqs, keys;
  while (keys.size() < 5) {
    auto m = f.sub->Next(2s);
    ASSERT_TRUE(m.ok() && m->has_value()) << "batch missing after " << keys.size() << " events";
    seqs.push_back((*m)->seq);
    for (const KvEvent& e : (*m)->batch.events) keys.push_back(e.block_hashes[0].lo);
    EXPECT_EQ((*m)->batch.data_parallel_rank, 0);
  }
  EXPECT_EQ(seqs, (std::vector<uint64_t>{0, 1, 2}));
  EXPECT_EQ(keys, (std::vector<uint64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(f.publisher->published(), 5u);
  EXPECT_EQ(f.publisher->dropped(), 0u);
  auto replay = f.sub->Replay(1, 2s);
  ASSERT_TRUE(replay.ok()) << replay.status().ToString();
  ASSERT_EQ(replay->size(), 2u);
  EXPECT_EQ((*replay)[0].seq, 1u);
  EXPECT_EQ((*replay)[1].batch.events.back().block_hashes[0].lo, 4u);
}

TEST(KvEventPublisher, AFullQueueDropsAndTheNextBatchSkipsASequenceNumber) {
  KvEventPublisherOptions o;
  o.queue_events = 2;
  o.flush_interval = 300ms;
  Fixture f(o);
  ASSERT_TRUE(f.publisher && f.sub);
  f.publisher->Add(Stored(1));
  auto first = f.sub->Next(2s);
  ASSERT_TRUE(first.ok() && first->has_value());
  EXPECT_EQ((*first)->seq, 0u);
  // Three events before the next flush into a queue of two: the third is dropped.
  for (uint64_t i = 2; i <= 4; ++i) f.publisher->Add(Stored(i));
  EXPECT_EQ(f.publisher->dropped(), 1u);
  auto next = f.sub->Next(2s);
  ASSERT_TRUE(next.ok() && next->has_value());
  EXPECT_EQ((*next)->seq, 2u) << "sequence 1 is the dropped events' gap";
  EXPECT_EQ((*next)->batch.events.size(), 2u);
  // The replay has no batch 1: the subscriber learns its view is incomplete.
  auto replay = f.sub->Replay(1, 2s);
  ASSERT_TRUE(replay.ok()) << replay.status().ToString();
  ASSERT_EQ(replay->size(), 1u);
  EXPECT_EQ((*replay)[0].seq, 2u);
  EXPECT_EQ(f.publisher->published(), 3u);
  EXPECT_NE(KvEventMetricsText(f.publisher.get()).find("kvtier_events_dropped_total 1\n"),
            std::string::npos);
}

TEST(KvEventPublisher, AnAddressThatCannotBeBoundIsRefused) {
  testing::TempDir dir{"kvtier-events"};
  KvEventPublisherOptions o;
  o.address = "ipc://" + dir.Sub("missing/events");
  auto p = KvEventPublisher::Create(o);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("cannot bind " + o.address), std::string::npos);
  EXPECT_TRUE(CheckKvEventsAddress("tcp://*:5557").ok());
  EXPECT_TRUE(CheckKvEventsAddress("tcp://[::1]:0").ok());
  EXPECT_TRUE(CheckKvEventsAddress("ipc:///run/kvtier/events").ok());
  EXPECT_FALSE(CheckKvEventsAddress("tcp://host").ok());
  EXPECT_FALSE(CheckKvEventsAddress("tcp://host:65536").ok());
  EXPECT_FALSE(CheckKvEventsAddress("inproc://x").ok());
}

}  // namespace
}  // namespace kvtier
