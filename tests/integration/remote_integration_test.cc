// The remote tier through real kvtierd processes ("nodes") sharing real Redis
// servers: what node A stored, node B hits with every byte verified (the
// replay's deterministic payloads); namespaces stay apart; a node restarting
// empty loses nothing the cluster holds; a corrupt value is a counted miss; a
// master killed mid-replay and a cluster stopped are misses, never errors or
// wrong bytes. And kvtier-bench remote, the remote tier's benchmark, runs end to end.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "campaign_util.h"
#include "kvtier/client.h"
#include "kvtier/tools/model_presets.h"
#include "kvtier/tools/synthetic_kv.h"
#include "kvtier/tools/trace.h"
#include "testing/daemon_process.h"
#include "testing/redis_servers.h"

namespace kvtier::testing {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

class RemoteNodesTest : public ::testing::Test {
 protected:
  void StartSingle() {
    auto s = RedisServers::StartSingle();
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    redis_ = std::move(s).value();
  }

  void StartCluster(int replicas = 1) {
    auto s = RedisServers::StartCluster({.num_masters = 3, .replicas_per_master = replicas});
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    redis_ = std::move(s).value();
  }

  // Node `name`: its own socket, DRAM and NVMe directory, the shared store.
  std::unique_ptr<DaemonProcess> Node(const std::string& name, bool events = false,
                                      const std::vector<std::string>& more = {}) {
    std::filesystem::create_directories(dir_.Sub(name + "-nvme"));
    DaemonProcess::Options o;
    o.socket_path = dir_.Sub(name + ".sock");
    o.dram_bytes = "32MiB";
    o.extra_args = {"--nvme-path", dir_.Sub(name + "-nvme"), "--nvme-bytes", "128MiB", "--remote",
                    redis_->Url(), "--remote-timeout-ms",    "200"};
    if (events) {
      o.extra_args.insert(o.extra_args.end(),
                          {"--events-address", "ipc://" + dir_.Sub(name + ".events")});
    }
    o.extra_args.insert(o.extra_args.end(), more.begin(), more.end());
    auto d = std::make_unique<DaemonProcess>(o);
    const std::string error = d->Start();
    EXPECT_EQ(error, "");
    return error.empty() ? std::move(d) : nullptr;
  }

  // The synthetic multi-turn trace's first `requests` requests (the first N
  // of any longer run are the same).
  json Replay(const std::string& node, const std::string& name,
              const std::vector<std::string>& extra = {}, const std::string& deadline_ms = "5000",
              const std::string& requests = "40") {
    const std::string out = dir_.Sub(name + ".json");
    std::vector<std::string> argv = {BinPath("kvtier-replay"),
                                     "--socket",
                                     dir_.Sub(node + ".sock"),
                                     "--generate",
                                     requests,
                                     "--quiet",
                                     "--deadline-ms",
                                     deadline_ms,
                                     "--json",
                                     out};
    argv.insert(argv.end(), extra.begin(), extra.end());
    CommandResult r = RunCommand(argv, 120s);
    EXPECT_TRUE(r.ok()) << r.Describe();
    return json::parse(ReadFileOrEmpty(out), nullptr, false);
  }

  static json Tier(DaemonProcess& d, const std::string& name) { return TierOf(StatsOf(d), name); }

  // Until the node's NVMe writer, and with it its remote writes, is idle.
  static void Flush(DaemonProcess& d) {
    CommandResult r = d.Ctl({"flush", "--timeout", "30"});
    ASSERT_TRUE(r.ok()) << r.Describe();
  }

  // The replay's verified hit tokens from the remote tier.
  static uint64_t RemoteHitTokens(const json& replay) {
    return replay["tiers"]["remote"]["hit_tokens"].get<uint64_t>();
  }

  TempDir dir_{"kvtier-remote-it"};
  std::unique_ptr<RedisServers> redis_;
};

TEST_F(RemoteNodesTest, WhatNodeAStoredNodeBHitsEveryByteVerified) {
  StartCluster();
  auto a = Node("a");
  auto b = Node("b");
  ASSERT_TRUE(a && b);
  const json first = Replay("a", "a");
  ASSERT_FALSE(first.is_discarded());
  Flush(*a);
  EXPECT_GT(Tier(*a, "remote")["write_bytes"].get<uint64_t>(), 0u);
  // Node B has never seen these prompts; without prefetch its loads promote
  // from the remote tier, with prefetch its tickets do.
  const json on_b = Replay("b", "b-load", {"--prefetch", "off"});
  ASSERT_FALSE(on_b.is_discarded());
  EXPECT_EQ(on_b["verify_errors"], 0);
  EXPECT_EQ(on_b["fail_open"], 0);
  EXPECT_GT(RemoteHitTokens(on_b), 0u);
  EXPECT_GT(on_b["hit_tokens"].get<uint64_t>(), first["hit_tokens"].get<uint64_t>());
  const json b_remote = Tier(*b, "remote");
  EXPECT_GT(b_remote["hits"].get<uint64_t>(), 0u);
  EXPECT_EQ(b_remote["corrupt_reads"], 0);
  EXPECT_FALSE(b_remote["degraded"].get<bool>());

  auto c = Node("c");
  ASSERT_TRUE(c);
  const json on_c = Replay("c", "c-prefetch", {"--prefetch", "wait_complete"});
  ASSERT_FALSE(on_c.is_discarded());
  EXPECT_EQ(on_c["verify_errors"], 0);
  EXPECT_GT(RemoteHitTokens(on_c), 0u);
  EXPECT_GT(on_c["prefetch"]["ready_in_time_chunks"].get<uint64_t>(), 0u);
}

TEST_F(RemoteNodesTest, WhatANodeStoresPastARemoteHitReachesItsOwnNvme) {
  StartCluster(0);
  auto a = Node("a");
  auto b = Node("b");
  ASSERT_TRUE(a && b);
  ASSERT_FALSE(Replay("a", "a", {}, "5000", "20").is_discarded());
  Flush(*a);
  // The next 20 requests go on with a's conversations: their prefixes are
  // remote hits on b, the turns past them b's own stores (under write-through,
  // to b's NVMe: NVMe holds no chunk without its parent, so the promoted
  // prefix goes there too, and not back to the remote tier).
  const json on_b = Replay("b", "b", {"--prefetch", "off"}, "5000", "40");
  ASSERT_FALSE(on_b.is_discarded());
  EXPECT_EQ(on_b["verify_errors"], 0);
  EXPECT_GT(RemoteHitTokens(on_b), 0u);
  Flush(*b);
  const json nvme = Tier(*b, "nvme"), remote = Tier(*b, "remote");
  EXPECT_EQ(nvme["lost_writes"], 0) << nvme.dump();
  EXPECT_GT(remote["write_bytes"].get<uint64_t>(), 0u);
  EXPECT_LT(remote["write_bytes"].get<uint64_t>(), nvme["write_bytes"].get<uint64_t>());
  // And b, restarted with its NVMe and the cluster stopped, hits what it stored.
  b->Stop();
  redis_->StopAll();
  b = Node("b");
  ASSERT_TRUE(b);
  const json again = Replay("b", "b-again", {"--prefetch", "off"}, "5000", "40");
  ASSERT_FALSE(again.is_discarded());
  EXPECT_EQ(again["verify_errors"], 0);
  // Everything the first run hit (remote or local) was in b's DRAM, so on its NVMe.
  EXPECT_EQ(RemoteHitTokens(again), 0u);
  EXPECT_GT(again["tiers"]["nvme"]["hit_tokens"].get<uint64_t>(), 0u);
  EXPECT_GE(again["hit_tokens"].get<uint64_t>(), on_b["hit_tokens"].get<uint64_t>());
}

TEST_F(RemoteNodesTest, ALookupWithoutLeaseCountsWhatTheRemoteTierHolds) {
  StartSingle();
  auto a = Node("a");
  auto b = Node("b");
  ASSERT_TRUE(a && b);
  Replay("a", "a");  // the generator's requests, as below
  Flush(*a);
  // What SGLang's batch_exists asks: a Lookup without lease, on node B that
  // never saw the prompt. Its answer counts the chunks the remote tier holds.
  ClientOptions o;
  o.socket_path = dir_.Sub("b.sock");
  o.deadline = std::chrono::seconds(5);
  auto client = Client::Connect(o);
  ASSERT_TRUE(client.ok() && (*client)->connected());
  auto spec = tools::ModelPreset("tiny", 256);
  ASSERT_TRUE(spec.ok());
  auto ns = (*client)->OpenNamespace(*spec);
  ASSERT_TRUE(ns.ok()) << ns.status().ToString();
  const auto trace = tools::GenerateMultiTurnTrace(40, 42);
  uint64_t found = 0, full = 0;
  for (const auto& req : trace) {
    const std::vector<int32_t> tokens = tools::SynthesizePrompt(req.hash_ids, req.input_length);
    auto lookup = (*client)->Lookup(*ns, tokens);
    ASSERT_TRUE(lookup.ok() && lookup->fail_open.ok());
    found += lookup->num_chunks;
    full += tokens.size() / 256;
  }
  EXPECT_GT(found, full / 2) << found << " of " << full << " chunks";
  EXPECT_EQ(Tier(*b, "dram")["chunks"], 0);  // nothing was read: the answer came from the store
}

TEST_F(RemoteNodesTest, UnderWriteBackWhatAStoppedNodeFlushedIsAHitOnAnother) {
  StartSingle();
  auto a = Node("a", false, {"--nvme-write-policy", "write_back"});
  ASSERT_TRUE(a);
  Replay("a", "a");
  // Write-back writes at eviction and at a clean stop: then NVMe and the store get it all.
  const ExitInfo stopped = a->Stop();
  EXPECT_TRUE(stopped.exited && stopped.exit_code == 0) << stopped.ToString();
  auto b = Node("b");
  ASSERT_TRUE(b);
  const json on_b = Replay("b", "b", {"--prefetch", "off"});
  ASSERT_FALSE(on_b.is_discarded());
  EXPECT_EQ(on_b["verify_errors"], 0);
  EXPECT_GT(RemoteHitTokens(on_b), 0u);
}

TEST_F(RemoteNodesTest, NamespacesStayApartAcrossNodes) {
  StartCluster(0);
  auto a = Node("a");
  auto b = Node("b");
  ASSERT_TRUE(a && b);
  Replay("a", "a", {"--chunk-tokens", "64"});
  Flush(*a);
  // The same prompts in another namespace (another chunk size): nothing of A's is B's.
  const json other = Replay("b", "b", {"--chunk-tokens", "32"});
  ASSERT_FALSE(other.is_discarded());
  EXPECT_EQ(RemoteHitTokens(other), 0u);
  EXPECT_EQ(Tier(*b, "remote")["hits"], 0);
}

TEST_F(RemoteNodesTest, ANodeRestartingEmptyLosesNothingTheClusterHolds) {
  StartCluster(0);
  auto a = Node("a");
  ASSERT_TRUE(a);
  const json first = Replay("a", "first");
  Flush(*a);
  a->Kill9();
  std::filesystem::remove_all(dir_.Sub("a-nvme"));  // its own tiers start empty
  a = Node("a");
  ASSERT_TRUE(a);
  const json again = Replay("a", "again", {"--prefetch", "off"});
  ASSERT_FALSE(again.is_discarded());
  EXPECT_EQ(again["verify_errors"], 0);
  EXPECT_GT(RemoteHitTokens(again), 0u);
  EXPECT_GT(again["hit_tokens"].get<uint64_t>(), first["hit_tokens"].get<uint64_t>());
}

TEST_F(RemoteNodesTest, AValueCorruptedBehindItsBackIsACountedMiss) {
  StartCluster(0);
  auto a = Node("a");
  auto b = Node("b");
  ASSERT_TRUE(a && b);
  Replay("a", "a");
  Flush(*a);
  // Flip one byte near the end (the payload) of every image on every master.
  size_t corrupted = 0;
  for (size_t m = 0; m < 3; ++m) {
    auto keys = redis_->Run(m, {"KEYS", "kvtier:*"});
    ASSERT_TRUE(keys.ok()) << keys.status().ToString();
    for (const RedisValue& k : keys->elements) {
      auto v = redis_->Run(m, {"GET", k.str});
      ASSERT_TRUE(v.ok() && !v->str.empty());
      std::string value = v->str;
      value[value.size() - 7] ^= 0x20;
      ASSERT_TRUE(redis_->Run(m, {"SET", k.str, value}).ok());
      ++corrupted;
    }
  }
  ASSERT_GT(corrupted, 0u);
  const json on_b = Replay("b", "b", {"--prefetch", "off"});
  ASSERT_FALSE(on_b.is_discarded());
  EXPECT_EQ(on_b["verify_errors"], 0);
  EXPECT_EQ(RemoteHitTokens(on_b), 0u);
  EXPECT_GT(Tier(*b, "remote")["corrupt_reads"].get<uint64_t>(), 0u);
}

TEST_F(RemoteNodesTest, AStoppedClusterIsMissesWithinTheDeadline) {
  StartCluster(0);
  auto a = Node("a");
  ASSERT_TRUE(a);
  redis_->StopAll();
  const auto t0 = std::chrono::steady_clock::now();
  const json run = Replay("a", "down", {}, "100");
  ASSERT_FALSE(run.is_discarded());
  EXPECT_EQ(run["verify_errors"], 0);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 60s);
  const json remote = Tier(*a, "remote");
  EXPECT_TRUE(remote["degraded"].get<bool>());
  EXPECT_GT(remote["io_errors"].get<uint64_t>(), 0u);
  // The node's own tiers kept serving.
  EXPECT_GT(run["hit_tokens"].get<uint64_t>(), 0u);
}

TEST_F(RemoteNodesTest, AMasterKilledMidReplayGivesMissesThenHitsAfterFailover) {
  StartCluster(1);
  auto a = Node("a");
  auto b = Node("b");
  ASSERT_TRUE(a && b);
  Replay("a", "a");
  Flush(*a);
  ASSERT_TRUE(redis_->WaitForReplicas(10s).ok());
  // Node B replays while master 0 dies.
  ChildProcess replay;
  std::string error;
  ASSERT_TRUE(replay.Spawn(
      {BinPath("kvtier-replay"), "--socket", dir_.Sub("b.sock"), "--generate", "40", "--quiet",
       "--prefetch", "off", "--deadline-ms", "5000", "--json", dir_.Sub("b-mid.json")},
      dir_.Sub("b-mid.out"), dir_.Sub("b-mid.err"), &error))
      << error;
  std::this_thread::sleep_for(50ms);
  redis_->Kill(0);
  auto exit = replay.Wait(120s);
  ASSERT_TRUE(exit.has_value());
  EXPECT_TRUE(exit->exited && exit->exit_code == 0) << ReadFileOrEmpty(dir_.Sub("b-mid.err"));
  const json mid = json::parse(ReadFileOrEmpty(dir_.Sub("b-mid.json")), nullptr, false);
  ASSERT_FALSE(mid.is_discarded());
  EXPECT_EQ(mid["verify_errors"], 0);
  const json b_remote = Tier(*b, "remote");
  std::printf("mid-replay: %s remote hit tokens, remote tier %s\n",
              mid["tiers"]["remote"]["hit_tokens"].dump().c_str(), b_remote.dump().c_str());
  auto promoted = redis_->WaitForFailover(0, 30s);
  ASSERT_TRUE(promoted.ok()) << promoted.status().ToString();
  // A fresh node C finds what A wrote, master 0's share too, on its replica.
  auto c = Node("c");
  ASSERT_TRUE(c);
  bool hits = false;
  for (int i = 0; i < 10 && !hits; ++i) {  // the node may still probe a degraded store
    const json after = Replay("c", "c-" + std::to_string(i), {"--prefetch", "off"});
    ASSERT_FALSE(after.is_discarded());
    EXPECT_EQ(after["verify_errors"], 0);
    hits = RemoteHitTokens(after) > 0;
    if (!hits) std::this_thread::sleep_for(1s);
  }
  EXPECT_TRUE(hits);
}

TEST_F(RemoteNodesTest, OneServerNotAClusterServesTwoNodes) {
  StartSingle();
  auto a = Node("a");
  auto b = Node("b");
  ASSERT_TRUE(a && b);
  Replay("a", "a");
  Flush(*a);
  const json on_b = Replay("b", "b", {"--prefetch", "off"});
  ASSERT_FALSE(on_b.is_discarded());
  EXPECT_EQ(on_b["verify_errors"], 0);
  EXPECT_GT(RemoteHitTokens(on_b), 0u);
}

TEST_F(RemoteNodesTest, AReplayAcrossNodesRoutedByTheirEventsKeepsConversationsLocal) {
  StartSingle();
  json runs[2];
  for (int i = 0; i < 2; ++i) {
    const std::string route = i == 0 ? "round_robin" : "prefix";
    // Fresh nodes and an empty store for each route.
    ASSERT_TRUE(redis_->Run(0, {"FLUSHALL"}).ok());
    auto a = Node(route + "-a", true);
    auto b = Node(route + "-b", true);
    ASSERT_TRUE(a && b);
    const std::string out = dir_.Sub(route + ".json");
    CommandResult r =
        RunCommand({BinPath("kvtier-replay"), "--nodes",
                    dir_.Sub(route + "-a.sock") + "," + dir_.Sub(route + "-b.sock"), "--route",
                    route, "--generate", "120", "--quiet", "--deadline-ms", "5000", "--json", out},
                   120s);
    ASSERT_TRUE(r.ok()) << r.Describe();
    runs[i] = json::parse(ReadFileOrEmpty(out), nullptr, false);
    ASSERT_FALSE(runs[i].is_discarded());
    ASSERT_EQ(runs[i]["nodes"].size(), 2u);
    EXPECT_EQ(runs[i]["total"]["verify_errors"], 0);
    for (const json& n : runs[i]["nodes"]) EXPECT_GT(n["requests"].get<uint64_t>(), 0u) << route;
  }
  const json& rr = runs[0];
  const json& prefix = runs[1];
  // Round robin sends a conversation's next turn to the other node, which
  // finds the earlier turns in the remote tier; the prefix router sends it
  // where the events showed its chunks.
  EXPECT_GT(rr["total"]["tiers"]["remote"]["hit_tokens"].get<uint64_t>(), 0u);
  EXPECT_GT(prefix["router"]["events"].get<uint64_t>(), 0u);
  EXPECT_GT(prefix["router"]["routed_by_prefix"].get<uint64_t>(), 0u);
  EXPECT_LT(prefix["total"]["tiers"]["remote"]["hit_tokens"].get<uint64_t>(),
            rr["total"]["tiers"]["remote"]["hit_tokens"].get<uint64_t>());
}

TEST_F(RemoteNodesTest, PrefixRoutingWithoutEventsOrBadNodesIsAUsageError) {
  StartSingle();
  auto a = Node("a");  // no --events-address
  ASSERT_TRUE(a);
  CommandResult r = RunCommand({BinPath("kvtier-replay"), "--nodes", dir_.Sub("a.sock"), "--route",
                                "prefix", "--generate", "5", "--quiet"},
                               30s);
  EXPECT_TRUE(r.exit.exited && r.exit.exit_code == 2) << r.Describe();
  EXPECT_NE(r.err.find("--events-address"), std::string::npos) << r.Describe();
  for (const std::string& nodes :
       {dir_.Sub("a.sock") + ",", std::string(), dir_.Sub("a.sock") + "," + dir_.Sub("a.sock")}) {
    r = RunCommand({BinPath("kvtier-replay"), "--nodes", nodes, "--generate", "5", "--quiet"}, 30s);
    EXPECT_TRUE(r.exit.exited && r.exit.exit_code == 2) << r.Describe();
    EXPECT_NE(r.err.find("--nodes"), std::string::npos) << r.Describe();
  }
}

TEST_F(RemoteNodesTest, ARemoteWithoutNvmeOrWithABadUrlIsAStartError) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--remote", "redis://127.0.0.1:1", "--nvme-bytes", "0"},
        std::vector<std::string>{"--remote", "http://127.0.0.1:6379", "--nvme-path", dir_.path()},
        std::vector<std::string>{"--remote", "redis://127.0.0.1:99999", "--nvme-path", dir_.path()},
        std::vector<std::string>{"--remote", "redis://127.0.0.1:6379", "--nvme-path", dir_.path(),
                                 "--remote-pool-size", "0"},
        std::vector<std::string>{"--remote", "", "--nvme-path", dir_.path()},
        std::vector<std::string>{"--remote", "redis://127.0.0.1:6379,", "--nvme-path",
                                 dir_.path()}}) {
    std::vector<std::string> argv = {BinPath("kvtierd"), "--socket", dir_.Sub("bad.sock"),
                                     "--metrics-address", "off"};
    argv.insert(argv.end(), args.begin(), args.end());
    CommandResult r = RunCommand(argv, 20s);
    EXPECT_TRUE(r.exit.exited && r.exit.exit_code == 2) << r.Describe();
    EXPECT_NE(r.err.find("remote"), std::string::npos) << r.Describe();
  }
}

// kvtier-bench remote (issue 13's benchmark), end to end with one image per round: on the
// 3-master cluster and the one server it starts itself, and on a store it is given. Each
// run checks every byte it reads back, and exits 1 when anything is not.
TEST_F(RemoteNodesTest, TheRemoteBenchmarkRunsOnItsOwnClusterAndOnAGivenStore) {
  auto given = RedisServers::StartSingle();
  ASSERT_TRUE(given.ok()) << given.status().ToString();
  for (const std::vector<std::string>& store :
       {std::vector<std::string>{}, std::vector<std::string>{"--single"},
        std::vector<std::string>{"--remote", (*given)->Url()}}) {
    std::vector<std::string> argv = {BinPath("kvtier-bench"), "remote", "--chunks", "1",
                                     "--iterations",          "1"};
    argv.insert(argv.end(), store.begin(), store.end());
    const CommandResult r = RunCommand(argv, 120s);
    EXPECT_TRUE(r.ok()) << r.Describe();
    for (const char* row : {"256.0 KiB      1", "1.0 MiB        1", "4.0 MiB        1"}) {
      EXPECT_NE(r.out.find(row), std::string::npos) << row << "\n" << r.Describe();
    }
    EXPECT_NE(r.out.find(store.empty() ? "3 masters" : "1 master,"), std::string::npos)
        << r.Describe();
  }
  // --single starts a store, --remote names one: not both.
  const CommandResult both =
      RunCommand({BinPath("kvtier-bench"), "remote", "--single", "--remote", (*given)->Url()}, 30s);
  EXPECT_TRUE(both.exit.exited && both.exit.exit_code == 2) << both.Describe();
}

}  // namespace
}  // namespace kvtier::testing
