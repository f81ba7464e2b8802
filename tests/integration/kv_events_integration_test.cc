// KV events against the real kvtierd (issue 13): every chunk stored, evicted
// or removed by an admin evict is published in vLLM's schema on an ipc://
// endpoint; the index rebuilt from the events alone equals the daemon's own
// listing; a late subscriber sees a gap and the replay socket fills it.
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>

#include "daemon_test_fixture.h"
#include "kvtier/admin_client.h"
#include "kvtier/client.h"
#include "kvtier/tools/kv_event_subscriber.h"
#include "kvtier/tools/model_presets.h"
#include "kvtier/tools/synthetic_kv.h"

namespace kvtier {
namespace {

using namespace integration;
using tools::KvEventSubscriber;
using Index = std::set<std::pair<std::string, std::string>>;  // (tier, key hex)

std::string TierOf(KvMedium m) {
  return m == KvMedium::kGpu ? "hbm" : m == KvMedium::kCpu ? "dram" : "nvme";
}

// What a router would keep: applies one batch's events to `index`.
void Apply(const KvEventBatch& batch, Index& index) {
  for (const KvEvent& e : batch.events) {
    if (e.type == KvEventType::kAllBlocksCleared) {
      index.clear();
      continue;
    }
    for (const ChunkKey& k : e.block_hashes) {
      if (e.type == KvEventType::kBlockStored) {
        index.insert({TierOf(e.medium), k.ToHex()});
      } else {
        index.erase({TierOf(e.medium), k.ToHex()});
      }
    }
  }
}

class KvEventsTest : public DaemonTest {
 protected:
  // Reads what is published (waiting up to `wait` for the first batch) into messages_.
  void Drain(std::chrono::milliseconds wait = 50ms) {
    for (;;) {
      auto m = sub_->Next(wait);
      ASSERT_TRUE(m.ok()) << m.status().ToString();
      if (!m->has_value()) return;
      messages_.push_back(std::move(**m));
      wait = 20ms;
    }
  }
  Index LiveIndex() const {
    Index index;
    for (const auto& m : messages_) Apply(m.batch, index);
    return index;
  }
  // The daemon's own listing of namespace `ns`.
  Index Listing(const NamespaceId& ns) {
    auto admin = AdminClient::Connect(socket_, 2s);
    if (!admin.ok()) return {{"error", admin.status().ToString()}};
    auto list = (*admin)->ListChunks(ns, {}, 100000);
    if (!list.ok()) return {{"error", list.status().ToString()}};
    Index index;
    for (const ChunkInfo& c : list->chunks) {
      for (const std::string& t : c.tiers) index.insert({t, c.key.ToHex()});
    }
    return index;
  }
  // Waits until the index rebuilt from the events equals the daemon's listing.
  bool IndexMatches(const NamespaceId& ns) {
    return WaitFor(
        [&] {
          Drain();
          return LiveIndex() == Listing(ns);
        },
        10s, 50ms);
  }
  size_t Count(KvEventType type, KvMedium medium) const {
    size_t n = 0;
    for (const auto& m : messages_) {
      for (const KvEvent& e : m.batch.events) n += e.type == type && e.medium == medium;
    }
    return n;
  }

  const std::string events_ = "ipc://" + dir_.Sub("events");
  const std::string replay_ = "ipc://" + dir_.Sub("replay");
  std::unique_ptr<KvEventSubscriber> sub_;
  std::vector<KvEventSubscriber::Message> messages_;
};

std::vector<int32_t> Prompt(int32_t base, size_t n) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = base + static_cast<int32_t>(i * 7 % 1000);
  return t;
}

TEST_F(KvEventsTest, StoresEvictionsAndAdminEvictRebuildTheDaemonsIndex) {
  auto spec = tools::ModelPreset("tiny", 128);
  ASSERT_TRUE(spec.ok());
  const SlotLayout layout = SlotLayout::For(*spec);
  DaemonProcess::Options o =
      Opts({"--events-address", events_, "--events-replay-address", replay_, "--nvme-path",
            dir_.path(), "--nvme-bytes", std::to_string(8 * layout.slot_bytes)});
  o.dram_bytes = std::to_string(12 * layout.slot_bytes);  // 12 chunks: stores below evict
  DaemonProcess daemon(o);
  ASSERT_EQ(daemon.Start(), "");
  auto sub = KvEventSubscriber::Connect(events_, replay_);
  ASSERT_TRUE(sub.ok()) << sub.status().ToString();
  sub_ = std::move(sub).value();
  std::this_thread::sleep_for(300ms);  // the SUB connection comes up asynchronously

  ClientOptions copts;
  copts.socket_path = socket_;
  copts.deadline = 2s;
  auto client = Client::Connect(copts);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto ns = (*client)->OpenNamespace(*spec);
  ASSERT_TRUE(ns.ok()) << ns.status().ToString();
  // Stores every full chunk of `tokens`, then waits for write-through to put
  // them on NVMe: a store while the NVMe queue is over half the arena is
  // dropped (kNvmeBehind) once the writer falls 20 ms behind, as it may under
  // a sanitizer, and this test is about the events, not that back-pressure.
  size_t written_through = 0;
  auto store = [&](const std::vector<int32_t>& tokens) {
    const auto keys = Client::ChunkKeys(*ns, tokens);
    auto r = (*client)->Store(*ns, tokens, [&](size_t i, std::span<std::byte> p) {
      tools::FillPayload(keys[i], spec->num_layers, p);
      return Status::Ok();
    });
    ASSERT_TRUE(r.ok() && r->fail_open.ok());
    ASSERT_EQ(r->stored_chunks, tokens.size() / 128) << "dropped " << r->dropped_chunks;
    written_through += r->stored_chunks;
    ASSERT_TRUE(WaitFor(
        [&] {
          Drain();
          return Count(KvEventType::kBlockStored, KvMedium::kStorage) >= written_through;
        },
        10s, 20ms))
        << Count(KvEventType::kBlockStored, KvMedium::kStorage) << " of " << written_through
        << " chunks on NVMe";
  };

  // One prompt of 4 full chunks: 4 BlockStored in DRAM ("CPU"), in prompt order,
  // each with its key, its parent (none for the first) and its 128 tokens.
  const auto a = Prompt(1000, 4 * 128 + 5);
  const auto keys = Client::ChunkKeys(*ns, a);
  store(a);
  ASSERT_TRUE(IndexMatches(ns->id)) << "events and listing differ after one store";
  std::vector<KvEvent> stored;
  for (const auto& m : messages_) {
    for (const KvEvent& e : m.batch.events) {
      if (e.type == KvEventType::kBlockStored && e.medium == KvMedium::kCpu) stored.push_back(e);
    }
  }
  ASSERT_EQ(stored.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    ASSERT_EQ(stored[i].block_hashes, std::vector<ChunkKey>{keys[i]}) << i;
    EXPECT_EQ(stored[i].parent, i == 0 ? std::nullopt : std::optional<ChunkKey>(keys[i - 1]));
    EXPECT_EQ(stored[i].block_size, 128u);
    EXPECT_EQ(stored[i].token_ids,
              std::vector<int32_t>(a.begin() + i * 128, a.begin() + (i + 1) * 128));
  }
  // Write-through puts them on NVMe too ("STORAGE"), tokens and all.
  EXPECT_EQ(Count(KvEventType::kBlockStored, KvMedium::kStorage), 4u);
  ASSERT_TRUE((*client)
                  ->Load(*ns, a, [](size_t, std::span<const std::byte>) { return Status::Ok(); })
                  .ok());

  // 20 more chunks than DRAM's 12 slots and NVMe's 8: both tiers evict.
  for (int32_t p = 0; p < 5; ++p) store(Prompt(20000 + 3000 * p, 4 * 128));
  ASSERT_TRUE(IndexMatches(ns->id)) << "events and listing differ after evictions";
  EXPECT_GT(Count(KvEventType::kBlockRemoved, KvMedium::kCpu), 0u);
  EXPECT_GT(Count(KvEventType::kBlockRemoved, KvMedium::kStorage), 0u);

  // An admin evict of the namespace: BlockRemoved for everything it held.
  CommandResult ev = daemon.Ctl({"evict", "--namespace", ns->id.ToHex()});
  ASSERT_TRUE(ev.ok()) << ev.Describe();
  ASSERT_TRUE(IndexMatches(ns->id)) << "events and listing differ after the admin evict";
  EXPECT_TRUE(LiveIndex().empty());

  // This subscriber joined late: batch 0 (AllBlocksCleared, at start) was
  // sent before it connected, a gap it sees in the sequence numbers. The
  // replay socket fills it, and what the replay gives from the subscriber's
  // first batch on is what it received live.
  ASSERT_FALSE(messages_.empty());
  const uint64_t first = messages_.front().seq;
  EXPECT_GT(first, 0u);
  for (size_t i = 1; i < messages_.size(); ++i) {
    ASSERT_EQ(messages_[i].seq, messages_[i - 1].seq + 1) << "a gap without drops";
  }
  auto replay = sub_->Replay(0, 5s);
  ASSERT_TRUE(replay.ok()) << replay.status().ToString();
  ASSERT_EQ(replay->size(), messages_.back().seq + 1);
  for (size_t i = 0; i < replay->size(); ++i) ASSERT_EQ((*replay)[i].seq, i);
  ASSERT_FALSE((*replay)[0].batch.events.empty());
  EXPECT_EQ((*replay)[0].batch.events[0].type, KvEventType::kAllBlocksCleared);
  for (const auto& m : messages_) {
    const auto& r = (*replay)[m.seq].batch;
    ASSERT_EQ(r.events.size(), m.batch.events.size());
    for (size_t i = 0; i < r.events.size(); ++i) {
      EXPECT_EQ(r.events[i].block_hashes, m.batch.events[i].block_hashes);
    }
  }
  // kvtierctl events prints the same events, one JSON line each, from the replay on.
  std::vector<std::string> want;
  for (const auto& m : *replay) {
    for (const KvEvent& e : m.batch.events) {
      want.push_back(std::string(KvEventTypeName(e.type)) +
                     (e.block_hashes.empty() ? "" : " " + e.block_hashes[0].ToHex()));
    }
  }
  CommandResult ctl =
      daemon.Ctl({"--json", "events", "--from", "0", "--count", std::to_string(want.size())});
  ASSERT_TRUE(ctl.ok()) << ctl.Describe();
  std::vector<std::string> got;
  std::istringstream lines(ctl.out);
  for (std::string line; std::getline(lines, line);) {
    json j = json::parse(line, nullptr, false);
    ASSERT_FALSE(j.is_discarded() || j.contains("gap")) << line;
    got.push_back(
        j["type"].get<std::string>() +
        (j.contains("block_hashes") ? " " + j["block_hashes"][0].get<std::string>() : ""));
  }
  EXPECT_EQ(got, want);

  auto tail = sub_->Replay(first + 1, 5s);
  ASSERT_TRUE(tail.ok()) << tail.status().ToString();
  ASSERT_EQ(tail->size(), messages_.size() - 1);
  EXPECT_EQ(tail->front().seq, first + 1);
}

TEST_F(DaemonTest, BadEventsAddressIsAUsageErrorNamingTheFlag) {
  for (const std::string bad :
       {"localhost:5557", "tcp://127.0.0.1", "tcp://127.0.0.1:99999", "ipc://", "udp://1.2.3.4:5",
        "tcp://localhost:5557", "tcp://::1:5557"}) {
    CommandResult r = RunCommand({BinPath("kvtierd"), "--socket", socket_, "--nvme-bytes", "0",
                                  "--metrics-address", "off", "--events-address", bad},
                                 20s);
    EXPECT_TRUE(r.exit.exited && r.exit.exit_code == 2) << bad << ": " << r.Describe();
    EXPECT_NE(r.err.find("--events-address '" + bad + "'"), std::string::npos) << r.Describe();
  }
  CommandResult r =
      RunCommand({BinPath("kvtierd"), "--socket", socket_, "--nvme-bytes", "0", "--metrics-address",
                  "off", "--events-replay-address", "ipc://" + dir_.Sub("replay")},
                 20s);
  EXPECT_TRUE(r.exit.exited && r.exit.exit_code == 2) << r.Describe();
  EXPECT_NE(r.err.find("--events-replay-address"), std::string::npos) << r.Describe();
  // Well formed but not bindable (a missing directory): the start fails naming the flag.
  r = RunCommand({BinPath("kvtierd"), "--socket", socket_, "--nvme-bytes", "0", "--metrics-address",
                  "off", "--events-address", "ipc://" + dir_.Sub("missing/events")},
                 20s);
  EXPECT_TRUE(r.exit.exited && r.exit.exit_code == 1) << r.Describe();
  EXPECT_NE(r.err.find("cannot start: --events-address: cannot bind"), std::string::npos)
      << r.Describe();
}

TEST_F(DaemonTest, KvtierctlEventsUsageErrorsExit2NamingWhatIsWrong) {
  const std::string ep = "ipc://" + dir_.Sub("none");
  for (const auto& [args, says] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--address", ep, "--replay-address", ep + "r", "--from", "-1"}, "--from"},
           {{"--address", ep, "--count", "abc"}, "abc"},
           {{"--address", "bogus"}, "cannot connect to bogus"},
           {{"--address", ep, "--replay-address", "bogus", "--from", "0"},
            "cannot connect to bogus"},
           {{"--address", ""}, "--address is empty"},
           {{"--address", ep, "--replay-address", ""}, "--replay-address is empty"}}) {
    std::vector<std::string> argv = {BinPath("kvtierctl"), "--socket", socket_, "events"};
    argv.insert(argv.end(), args.begin(), args.end());
    CommandResult r = RunCommand(argv, 10s);  // none waits for events
    EXPECT_TRUE(r.exit.exited && r.exit.exit_code == 2) << r.Describe();
    EXPECT_NE(r.err.find(says), std::string::npos) << r.Describe();
    EXPECT_EQ(r.err.find("not in range"), std::string::npos) << r.Describe();
  }
  // Well formed, but nothing listens on the replay endpoint: an error within
  // the replay's 5 s, not a wait without end.
  CommandResult r = RunCommand({BinPath("kvtierctl"), "--socket", socket_, "events", "--address",
                                ep, "--replay-address", ep + "r", "--from", "0"},
                               20s);
  EXPECT_TRUE(r.exit.exited && r.exit.exit_code == 1) << r.Describe();
  EXPECT_NE(r.err.find("end marker did not come within 5000 ms"), std::string::npos)
      << r.Describe();
}

// Port 0 takes any free port: kvtierctl config, and so kvtierctl events and
// kvtier-replay's router, give the ports taken (they said ":0" before).
TEST_F(KvEventsTest, EndpointsOnPortZeroAreFoundThroughTheDaemonsConfig) {
  DaemonProcess daemon(Opts(
      {"--events-address", "tcp://127.0.0.1:0", "--events-replay-address", "tcp://127.0.0.1:0"}));
  ASSERT_EQ(daemon.Start(), "");
  CommandResult config = daemon.Ctl({"--json", "config"});
  ASSERT_TRUE(config.ok()) << config.Describe();
  EXPECT_EQ(config.out.find("127.0.0.1:0\""), std::string::npos) << config.out;
  // The AllBlocksCleared of the daemon's start, from the replay endpoint.
  CommandResult events = daemon.Ctl({"--json", "events", "--from", "0", "--count", "1"});
  ASSERT_TRUE(events.ok()) << events.Describe();
  EXPECT_NE(events.out.find("AllBlocksCleared"), std::string::npos) << events.Describe();
}

TEST_F(KvEventsTest, ASecondDaemonOnTheSameEventsEndpointIsRefused) {
  DaemonProcess first(Opts({"--events-address", events_, "--events-replay-address", replay_}));
  ASSERT_EQ(first.Start(), "");
  for (const auto& [flag, value] : std::vector<std::pair<std::string, std::string>>{
           {"--events-address", events_}, {"--events-replay-address", replay_}}) {
    std::vector<std::string> argv = {
        BinPath("kvtierd"),
        "--socket",
        dir_.Sub("second.sock"),
        "--nvme-bytes",
        "0",
        "--metrics-address",
        "off",
        "--events-address",
        flag == "--events-address" ? value : "ipc://" + dir_.Sub("e2"),
        "--events-replay-address",
        flag == "--events-replay-address" ? value : "ipc://" + dir_.Sub("r2")};
    CommandResult r = RunCommand(argv, 20s);
    EXPECT_TRUE(r.exit.exited && r.exit.exit_code == 1) << r.Describe();
    EXPECT_NE(r.err.find(flag + ": cannot bind " + value + ": in use"), std::string::npos)
        << r.Describe();
  }
  // The first daemon's stream is still live: a subscriber sees its batches.
  auto sub = KvEventSubscriber::Connect(events_, replay_);
  ASSERT_TRUE(sub.ok()) << sub.status().ToString();
  auto replay = (*sub)->Replay(0, 5s);
  ASSERT_TRUE(replay.ok()) << replay.status().ToString();
  EXPECT_FALSE(replay->empty()) << "no AllBlocksCleared batch from the first daemon";
}

}  // namespace
}  // namespace kvtier
