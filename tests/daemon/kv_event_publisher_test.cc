// KvEventPublisher on ipc:// in a temp dir, read with the tools' subscriber:
// batches in order with consecutive sequence numbers, a full queue drops and
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
    if (publisher && sub) WaitUntilSubscribed(o.flush_interval);
  }
  // The SUB connection comes up asynchronously, and PUB drops what it sends
  // before: one event a flush until the subscriber sees one. `next_seq` is
  // then the sequence number of the next batch, `published` the events so far.
  void WaitUntilSubscribed(std::chrono::milliseconds flush_interval) {
    for (auto until = std::chrono::steady_clock::now() + 20s;
         std::chrono::steady_clock::now() < until;) {
      publisher->Add(Stored(1000));
      auto m = sub->Next(flush_interval + 100ms);
      ASSERT_TRUE(m.ok()) << m.status().ToString();
      if (!m->has_value()) continue;
      next_seq = (*m)->seq + 1;
      // A warm-up event still queued comes within a flush.
      for (auto more = sub->Next(flush_interval + 100ms); more.ok() && more->has_value();
           more = sub->Next(flush_interval + 100ms)) {
        next_seq = (**more).seq + 1;
      }
      published = publisher->published();
      return;
    }
    FAIL() << "the subscriber saw no batch in 20 s";
  }
  uint64_t next_seq = 0;
  uint64_t published = 0;
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
  const uint64_t s0 = f.next_seq;
  EXPECT_EQ(seqs, (std::vector<uint64_t>{s0, s0 + 1, s0 + 2}));
  EXPECT_EQ(keys, (std::vector<uint64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(f.publisher->published(), f.published + 5);
  EXPECT_EQ(f.publisher->dropped(), 0u);
  auto replay = f.sub->Replay(s0 + 1, 2s);
  ASSERT_TRUE(replay.ok()) << replay.status().ToString();
  ASSERT_EQ(replay->size(), 2u);
  EXPECT_EQ((*replay)[0].seq, s0 + 1);
  EXPECT_EQ((*replay)[1].batch.events.back().block_hashes[0].lo, 4u);
}

TEST(KvEventPublisher, AFullQueueDropsAndTheNextBatchSkipsASequenceNumber) {
  KvEventPublisherOptions o;
  o.queue_events = 2;
  o.flush_interval = 300ms;
  Fixture f(o);
  ASSERT_TRUE(f.publisher && f.sub);
  const uint64_t s0 = f.next_seq;
  f.publisher->Add(Stored(1));
  auto first = f.sub->Next(2s);
  ASSERT_TRUE(first.ok() && first->has_value());
  EXPECT_EQ((*first)->seq, s0);
  // Three events before the next flush into a queue of two: the third is dropped.
  for (uint64_t i = 2; i <= 4; ++i) f.publisher->Add(Stored(i));
  EXPECT_EQ(f.publisher->dropped(), 1u);
  auto next = f.sub->Next(2s);
  ASSERT_TRUE(next.ok() && next->has_value());
  EXPECT_EQ((*next)->seq, s0 + 2) << "sequence s0 + 1 is the dropped events' gap";
  EXPECT_EQ((*next)->batch.events.size(), 2u);
  // The replay has no batch 1: the subscriber learns its view is incomplete.
  auto replay = f.sub->Replay(s0 + 1, 2s);
  ASSERT_TRUE(replay.ok()) << replay.status().ToString();
  ASSERT_EQ(replay->size(), 1u);
  EXPECT_EQ((*replay)[0].seq, s0 + 2);
  EXPECT_EQ(f.publisher->published(), f.published + 3);
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
  EXPECT_TRUE(CheckKvEventsAddress("tcp://127.0.0.1:5557").ok());
  EXPECT_TRUE(CheckKvEventsAddress("tcp://lo:5557").ok());  // an interface: ZMQ binds its address
  EXPECT_FALSE(CheckKvEventsAddress("tcp://host").ok());
  EXPECT_FALSE(CheckKvEventsAddress("tcp://host:65536").ok());
  EXPECT_FALSE(CheckKvEventsAddress("inproc://x").ok());
  // ZMQ binds no host name (it would fail later with "No such device").
  Status name = CheckKvEventsAddress("tcp://localhost:5557");
  EXPECT_NE(name.message().find("HOST 'localhost'"), std::string::npos) << name.ToString();
  EXPECT_NE(CheckKvEventsAddress("tcp://::1:5557").message().find("without [ ]"),
            std::string::npos);
  EXPECT_NE(CheckKvEventsAddress("tcp://[::1:5557").message().find("no ']'"), std::string::npos);
  EXPECT_NE(CheckKvEventsAddress("tcp://[x]:5557").message().find("'[x]', which is not an IPv6"),
            std::string::npos);
}

TEST(KvEventPublisher, AnIpcEndpointALivePublisherHoldsIsRefusedAndKeepsServing) {
  KvEventPublisherOptions o;
  o.flush_interval = 20ms;
  Fixture f(o);
  ASSERT_TRUE(f.publisher && f.sub);
  KvEventPublisherOptions second;
  second.address = "ipc://" + f.dir.Sub("events");
  auto p = KvEventPublisher::Create(second);
  ASSERT_FALSE(p.ok()) << "a second publisher took over a live endpoint";
  EXPECT_NE(p.status().message().find("in use"), std::string::npos) << p.status().ToString();
  second.address = "ipc://" + f.dir.Sub("other");
  second.replay_address = "ipc://" + f.dir.Sub("replay");
  p = KvEventPublisher::Create(second);
  ASSERT_FALSE(p.ok()) << "a second publisher took over a live replay endpoint";
  // The first one's subscribers still get its batches.
  f.publisher->Add(Stored(7));
  auto m = f.sub->Next(5s);
  ASSERT_TRUE(m.ok() && m->has_value());
  EXPECT_EQ((*m)->batch.events[0].block_hashes[0].lo, 7u);
  // A socket file nobody listens on (a publisher gone) is taken over.
  f.publisher.reset();
  second.replay_address.clear();
  second.address = "ipc://" + f.dir.Sub("events");
  EXPECT_TRUE(KvEventPublisher::Create(second).ok());
}

TEST(KvEventPublisher, BindsTcpOnIpv4AndIpv6Loopback) {
  KvEventPublisherOptions o;
  o.address = "tcp://127.0.0.1:0";
  auto v4 = KvEventPublisher::Create(o);
  ASSERT_TRUE(v4.ok()) << v4.status().ToString();
  EXPECT_EQ((*v4)->address().rfind("tcp://127.0.0.1:", 0), 0u) << (*v4)->address();
  o.address = "tcp://[::1]:0";
  auto v6 = KvEventPublisher::Create(o);
  ASSERT_TRUE(v6.ok()) << v6.status().ToString();
  EXPECT_EQ((*v6)->address().rfind("tcp://[::1]:", 0), 0u) << (*v6)->address();
}

}  // namespace
}  // namespace kvtier
