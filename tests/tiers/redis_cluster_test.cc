// RedisCluster against real redis-server processes (tests/testing/redis_servers.h):
// URL parsing, key slots checked by the server, round trips, errors, single-server
// mode, slot migration (ASK, MOVED), a failover, a stopped cluster, threads.
#include "kvtier/tiers/redis_cluster.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/status_printer.h"
#include "testing/redis_servers.h"

namespace kvtier {
namespace {

using std::chrono::milliseconds;
using testing::RedisServers;
using Bytes = std::vector<std::byte>;
using Clock = std::chrono::steady_clock;

Bytes RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  Bytes b(n);
  for (auto& x : b) x = static_cast<std::byte>(rng());
  return b;
}

RedisClusterOptions OptionsFor(const RedisServers& servers) {
  RedisClusterOptions o;
  o.seeds = servers.Seeds();
  o.io_timeout = milliseconds(2000);  // 4 MiB values under a sanitizer
  o.connect_timeout = milliseconds(200);
  o.topology_refresh = milliseconds(100);
  o.reconnect_backoff = milliseconds(50);
  return o;
}

std::unique_ptr<RedisCluster> MakeClient(const RedisClusterOptions& o) {
  auto c = RedisCluster::Create(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(c).value() : nullptr;
}

// Writes values[i] under keys[i]; every SET must succeed.
void SetAll(RedisCluster& c, const std::vector<std::string>& keys,
            const std::vector<Bytes>& values) {
  std::vector<RedisCluster::Set> sets(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) sets[i] = {keys[i], values[i], {}};
  c.SetMany(sets);
  for (size_t i = 0; i < sets.size(); ++i) {
    ASSERT_TRUE(sets[i].result.ok()) << keys[i] << ": " << sets[i].result.ToString();
  }
}

// Reads keys[i] into buffers of values[i]'s size; the results, in order.
std::vector<Status> GetAll(RedisCluster& c, const std::vector<std::string>& keys,
                           const std::vector<Bytes>& values, std::vector<Bytes>* got) {
  got->assign(keys.size(), Bytes());
  std::vector<RedisCluster::Get> gets(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    (*got)[i].assign(values[i].size(), std::byte{0});
    gets[i] = {keys[i], (*got)[i], 0, {}};
  }
  c.GetMany(gets);
  std::vector<Status> results;
  for (size_t i = 0; i < gets.size(); ++i) {
    if (gets[i].result.ok()) {
      EXPECT_EQ(gets[i].bytes, values[i].size()) << keys[i];
      EXPECT_TRUE((*got)[i] == values[i]) << keys[i] << ": wrong bytes";
    }
    results.push_back(gets[i].result);
  }
  return results;
}

// Every GET of keys succeeds with values.
void ExpectAllRead(RedisCluster& c, const std::vector<std::string>& keys,
                   const std::vector<Bytes>& values) {
  std::vector<Bytes> got;
  const auto results = GetAll(c, keys, values, &got);
  for (size_t i = 0; i < results.size(); ++i) {
    EXPECT_TRUE(results[i].ok()) << keys[i] << ": " << results[i].ToString();
  }
}

TEST(ParseRedisUrl, AcceptsSeedsWithDefaultPortsAndIpv6) {
  auto seeds = ParseRedisUrl("redis://a.example:7000,10.0.0.2,[::1]:7001,[fe80::1]");
  ASSERT_TRUE(seeds.ok()) << seeds.status().ToString();
  ASSERT_EQ(seeds->size(), 4u);
  EXPECT_EQ((*seeds)[0].host, "a.example");
  EXPECT_EQ((*seeds)[0].port, 7000);
  EXPECT_EQ((*seeds)[1].host, "10.0.0.2");
  EXPECT_EQ((*seeds)[1].port, 6379);
  EXPECT_EQ((*seeds)[2].host, "::1");
  EXPECT_EQ((*seeds)[2].port, 7001);
  EXPECT_EQ((*seeds)[3].ToString(), "[fe80::1]:6379");
  EXPECT_EQ((*seeds)[0].ToString(), "a.example:7000");
}

TEST(ParseRedisUrl, RejectsBadInputsNamingTheProblem) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"http://h:1", "scheme"},
      {"h:1", "scheme"},
      {"redis://", "empty host"},
      {"redis://:6379", "empty host"},
      {"redis://a:1,,b:2", "host 2 of 'redis://a:1,,b:2': empty host"},
      {"redis://a:1,", "host 2 of 'redis://a:1,': empty host"},
      {"redis://h:0", "port '0'"},
      {"redis://h:65536", "port '65536'"},
      {"redis://h:x1", "port 'x1'"},
      {"redis://h:", "empty port"},
      {"redis://user:pw@h:1", "user or password"},
      {"redis://h:1/0", "path"},
      {"redis://h:1?db=0", "query"},
      {"redis://::1:6379", "brackets"},
      {"redis://[::1:6379", "']'"},
      {"redis://[::1]x", "':' must follow"},
  };
  for (const auto& [url, want] : cases) {
    auto r = ParseRedisUrl(url);
    ASSERT_FALSE(r.ok()) << url;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << url;
    EXPECT_NE(r.status().message().find(want), std::string::npos)
        << url << ": " << r.status().message();
  }
}

TEST(RedisClusterOptions, ValidateNamesTheField) {
  RedisClusterOptions o;
  EXPECT_NE(o.Validate().message().find("seeds"), std::string::npos);
  o.seeds = {{"127.0.0.1", 1}};
  EXPECT_TRUE(o.Validate().ok());
  o.pool_size = 0;
  EXPECT_NE(o.Validate().message().find("pool_size"), std::string::npos);
  o.pool_size = 4;
  o.max_redirects = 17;
  EXPECT_NE(o.Validate().message().find("max_redirects"), std::string::npos);
  EXPECT_FALSE(RedisCluster::Create(o).ok());
}

// A cluster of 3 masters with a replica each, shared by the tests that do not break it.
class RedisClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto s = RedisServers::StartCluster({});
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    servers_ = std::move(s).value().release();
  }
  static void TearDownTestSuite() {
    delete servers_;
    servers_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(servers_, nullptr);
    client_ = MakeClient(OptionsFor(*servers_));
    ASSERT_NE(client_, nullptr);
  }
  static RedisServers* servers_;
  std::unique_ptr<RedisCluster> client_;
};
RedisServers* RedisClusterTest::servers_ = nullptr;

TEST_F(RedisClusterTest, KeySlotMatchesTheServers) {
  EXPECT_EQ(RedisCluster::KeySlot("123456789"), 0x31C3 % 16384);  // CRC16-XMODEM check value
  std::vector<std::string> keys = {"",
                                   "foo",
                                   "{user1000}.following",
                                   "{user1000}.followers",
                                   "foo{}{bar}",
                                   "foo{{bar}}zap",
                                   "foo{bar}{zap}",
                                   "{}",
                                   "{",
                                   "}{a}",
                                   std::string("\0\xff{\x01}", 5)};
  std::mt19937 rng(7);
  for (int i = 0; i < 100; ++i) {
    std::string k(1 + rng() % 40, '\0');
    for (char& ch : k) ch = static_cast<char>(rng());
    keys.push_back(k);
  }
  for (const std::string& k : keys) {
    auto want = servers_->KeySlot(k);
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    EXPECT_EQ(RedisCluster::KeySlot(k), *want) << "key of " << k.size() << " bytes";
  }
}

TEST_F(RedisClusterTest, RoundTripsValuesOfEverySizeOnEveryMaster) {
  std::vector<std::string> keys;
  std::vector<Bytes> values;
  std::set<size_t> masters;
  const size_t sizes[] = {4 << 10, 256 << 10, 1 << 20, 4 << 20};
  for (size_t s = 0; s < 4; ++s) {
    for (int i = 0; i < 6; ++i) {
      keys.push_back("rt/" + std::to_string(sizes[s]) + "/" + std::to_string(i));
      values.push_back(RandomBytes(sizes[s], static_cast<uint32_t>(s * 100 + i)));
      auto slot = servers_->KeySlot(keys.back());
      ASSERT_TRUE(slot.ok());
      auto m = servers_->MasterOfSlot(*slot);
      ASSERT_TRUE(m.ok()) << m.status().ToString();
      masters.insert(*m);
    }
  }
  ASSERT_EQ(masters.size(), 3u) << "the keys must spread over every master";
  SetAll(*client_, keys, values);
  ExpectAllRead(*client_, keys, values);
  EXPECT_TRUE(client_->cluster_mode());
  EXPECT_EQ(client_->Masters().size(), 3u);
  EXPECT_EQ(client_->counters().errors, 0u);
}

TEST_F(RedisClusterTest, MissingKeyIsNotFound) {
  Bytes buf(16);
  RedisCluster::Get g{"never/written", buf, 99, {}};
  client_->GetMany({&g, 1});
  EXPECT_EQ(g.result.code(), StatusCode::kNotFound) << g.result.ToString();
  EXPECT_EQ(g.bytes, 0u);
}

TEST_F(RedisClusterTest, ValueLongerThanDstIsDataLossAndNothingIsWrittenPastDst) {
  const Bytes value = RandomBytes(1000, 3);
  SetAll(*client_, {"dl/a", "dl/b"}, {value, value});
  constexpr size_t kGuard = 64;
  Bytes small(999 + kGuard, std::byte{0xAB});
  Bytes exact(1000 + kGuard, std::byte{0xCD});
  RedisCluster::Get gets[2] = {{"dl/a", std::span(small).first(999), 0, {}},
                               {"dl/b", std::span(exact).first(1000), 0, {}}};
  client_->GetMany(gets);
  EXPECT_EQ(gets[0].result.code(), StatusCode::kDataLoss) << gets[0].result.ToString();
  EXPECT_EQ(gets[0].bytes, 1000u);
  EXPECT_TRUE(
      std::all_of(small.begin(), small.end(), [](std::byte b) { return b == std::byte{0xAB}; }));
  ASSERT_TRUE(gets[1].result.ok()) << gets[1].result.ToString();
  EXPECT_TRUE(std::equal(value.begin(), value.end(), exact.begin()));
  EXPECT_TRUE(std::all_of(exact.begin() + 1000, exact.end(),
                          [](std::byte b) { return b == std::byte{0xCD}; }));
}

TEST_F(RedisClusterTest, ExistsAndDel) {
  SetAll(*client_, {"ed/a", "ed/b"}, {RandomBytes(10, 1), RandomBytes(10, 2)});
  RedisCluster::Exists ex[3] = {{"ed/a", false, {}}, {"ed/b", false, {}}, {"ed/none", true, {}}};
  client_->ExistsMany(ex);
  for (auto& e : ex) ASSERT_TRUE(e.result.ok()) << e.result.ToString();
  EXPECT_TRUE(ex[0].found);
  EXPECT_TRUE(ex[1].found);
  EXPECT_FALSE(ex[2].found);
  RedisCluster::Del del[2] = {{"ed/a", {}}, {"ed/none", {}}};
  client_->DelMany(del);
  EXPECT_TRUE(del[0].result.ok()) << del[0].result.ToString();
  EXPECT_TRUE(del[1].result.ok()) << del[1].result.ToString();
  client_->ExistsMany(ex);
  EXPECT_FALSE(ex[0].found);
  EXPECT_TRUE(ex[1].found);
}

TEST_F(RedisClusterTest, SetWithExpireSetsATtl) {
  const Bytes v = RandomBytes(8, 5);
  RedisCluster::Set s{"ttl/a", v, {}};
  client_->SetMany({&s, 1}, 100);
  ASSERT_TRUE(s.result.ok()) << s.result.ToString();
  auto m = servers_->MasterOfSlot(RedisCluster::KeySlot("ttl/a"));
  ASSERT_TRUE(m.ok());
  auto ttl = servers_->Run(*m, {"TTL", "ttl/a"});
  ASSERT_TRUE(ttl.ok());
  EXPECT_GT(ttl->integer, 0);
  EXPECT_LE(ttl->integer, 100);
}

TEST_F(RedisClusterTest, WrongTypeAnswerIsDataLossNamingTheNode) {
  auto m = servers_->MasterOfSlot(RedisCluster::KeySlot("odd/list"));
  ASSERT_TRUE(m.ok());
  ASSERT_TRUE(servers_->Run(*m, {"RPUSH", "odd/list", "x"}).ok());
  Bytes buf(16, std::byte{0x11});
  RedisCluster::Get g{"odd/list", buf, 0, {}};
  client_->GetMany({&g, 1});
  EXPECT_EQ(g.result.code(), StatusCode::kDataLoss);  // the node is up: not a failure of it
  EXPECT_NE(g.result.message().find(servers_->endpoint(*m).ToString()), std::string::npos)
      << g.result.message();
  EXPECT_NE(g.result.message().find("WRONGTYPE"), std::string::npos) << g.result.message();
  EXPECT_TRUE(
      std::all_of(buf.begin(), buf.end(), [](std::byte b) { return b == std::byte{0x11}; }));
}

TEST_F(RedisClusterTest, SlowMasterTimesOutWhileTheOthersServe) {
  std::vector<std::string> keys;
  std::vector<Bytes> values;
  for (int i = 0; i < 12; ++i) {
    keys.push_back("slow/" + std::to_string(i));
    values.push_back(RandomBytes(1000, static_cast<uint32_t>(i)));
  }
  SetAll(*client_, keys, values);
  auto slow = servers_->MasterOfSlot(RedisCluster::KeySlot(keys[0]));
  ASSERT_TRUE(slow.ok());
  RedisClusterOptions o = OptionsFor(*servers_);
  o.io_timeout = milliseconds(100);
  auto client = MakeClient(o);
  ASSERT_NE(client, nullptr);
  ExpectAllRead(*client, keys, values);  // connections made and the map known before
  // Half a second: well under the node timeout, so no failover starts.
  std::thread sleeper([&] { (void)servers_->Run(*slow, {"DEBUG", "SLEEP", "0.5"}); });
  std::this_thread::sleep_for(milliseconds(50));
  const auto start = Clock::now();
  std::vector<Bytes> got;
  const auto results = GetAll(*client, keys, values, &got);
  const auto elapsed = Clock::now() - start;
  sleeper.join();
  EXPECT_LT(elapsed, milliseconds(400)) << "one io_timeout for the slow node, not its sleep";
  for (size_t i = 0; i < keys.size(); ++i) {
    auto m = servers_->MasterOfSlot(RedisCluster::KeySlot(keys[i]));
    ASSERT_TRUE(m.ok());
    if (*m == *slow) {
      EXPECT_EQ(results[i].code(), StatusCode::kUnavailable) << keys[i];
      EXPECT_NE(results[i].message().find("io_timeout"), std::string::npos) << results[i].message();
    } else {
      EXPECT_TRUE(results[i].ok()) << keys[i] << ": " << results[i].ToString();
    }
  }
  EXPECT_GE(client->counters().timeouts, 1u);
  ExpectAllRead(*client, keys, values);  // the node is back; a new connection is made
}

TEST_F(RedisClusterTest, TwoClientsAndSeveralThreadsAtOnce) {
  RedisClusterOptions o = OptionsFor(*servers_);
  o.pool_size = 2;  // fewer connections than threads: some wait for one
  auto other = MakeClient(o);
  ASSERT_NE(other, nullptr);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      RedisCluster& c = t % 2 == 0 ? *client_ : *other;
      for (int round = 0; round < 20; ++round) {
        std::vector<std::string> keys;
        std::vector<Bytes> values;
        for (int i = 0; i < 8; ++i) {
          keys.push_back("mt/" + std::to_string(t) + "/" + std::to_string(i));
          values.push_back(RandomBytes(1024, static_cast<uint32_t>(t * 1000 + round * 10 + i)));
        }
        SetAll(c, keys, values);
        ExpectAllRead(c, keys, values);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(client_->counters().errors + other->counters().errors, 0u);
}

TEST(RedisSingleServer, ServesEveryKeyWithoutCluster) {
  auto s = RedisServers::StartSingle();
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  auto client = MakeClient(OptionsFor(**s));
  ASSERT_NE(client, nullptr);
  std::vector<std::string> keys;
  std::vector<Bytes> values;
  for (int i = 0; i < 20; ++i) {
    keys.push_back("single/" + std::to_string(i));
    values.push_back(RandomBytes(256 << 10, static_cast<uint32_t>(i)));
  }
  SetAll(*client, keys, values);
  ExpectAllRead(*client, keys, values);
  EXPECT_FALSE(client->cluster_mode());
  ASSERT_EQ(client->Masters().size(), 1u);
  EXPECT_EQ(client->Masters()[0].port, (*s)->port(0));
  Bytes buf(4);
  RedisCluster::Get g{"single/none", buf, 0, {}};
  client->GetMany({&g, 1});
  EXPECT_EQ(g.result.code(), StatusCode::kNotFound);
  RedisCluster::Del d{"single/0", {}};
  client->DelMany({&d, 1});
  RedisCluster::Exists e{"single/0", true, {}};
  client->ExistsMany({&e, 1});
  EXPECT_TRUE(d.result.ok() && e.result.ok());
  EXPECT_FALSE(e.found);
}

// Keys named prefix/0..n-1 with random values of `bytes` each.
void MakeKeys(const std::string& prefix, int n, size_t bytes, std::vector<std::string>* keys,
              std::vector<Bytes>* values) {
  for (int i = 0; i < n; ++i) {
    keys->push_back(prefix + "/" + std::to_string(i));
    values->push_back(
        RandomBytes(bytes, static_cast<uint32_t>(std::hash<std::string>()(keys->back()))));
  }
}

TEST(RedisSingleServer, ReachesAnIpv6Address) {
  auto s = RedisServers::StartSingle(/*ipv6=*/true);
  if (!s.ok()) GTEST_SKIP() << "no redis-server on ::1: " << s.status().ToString();
  auto seeds = ParseRedisUrl("redis://[::1]:" + std::to_string((*s)->port(0)));
  ASSERT_TRUE(seeds.ok()) << seeds.status().ToString();
  RedisClusterOptions o = OptionsFor(**s);
  o.seeds = *seeds;
  auto client = MakeClient(o);
  ASSERT_NE(client, nullptr);
  const std::vector<std::string> keys = {"v6/a"};
  const std::vector<Bytes> values = {RandomBytes(100, 6)};
  SetAll(*client, keys, values);
  ExpectAllRead(*client, keys, values);
  ASSERT_EQ(client->Masters().size(), 1u);
  EXPECT_EQ(client->Masters()[0].ToString(), "[::1]:" + std::to_string((*s)->port(0)));
}

TEST(RedisSingleServer, PooledConnectionsTheServerClosedAreReplaced) {
  auto s = RedisServers::StartSingle();
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  auto client = MakeClient(OptionsFor(**s));
  ASSERT_NE(client, nullptr);
  const std::vector<std::string> keys = {"kill/a", "kill/b"};
  const std::vector<Bytes> values = {RandomBytes(5000, 1), RandomBytes(5000, 2)};
  SetAll(*client, keys, values);
  const uint64_t connects = client->counters().connects;
  // The server closes every client connection but the one asking: our pooled ones.
  auto killed = (*s)->Run(0, {"CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"});
  ASSERT_TRUE(killed.ok() && killed->integer >= 1) << killed->ToString();
  ExpectAllRead(*client, keys, values);
  EXPECT_GT(client->counters().connects, connects);
  EXPECT_EQ(client->counters().errors, 0u);
}

TEST(RedisClusterMigration, KeysOfAMigratingSlotReadThroughAskThenMoved) {
  RedisServers::ClusterOptions co;
  co.replicas_per_master = 0;
  auto s = RedisServers::StartCluster(co);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  RedisServers& servers = **s;
  auto client = MakeClient(OptionsFor(servers));
  ASSERT_NE(client, nullptr);
  // Keys in one slot (hash tag), and keys elsewhere.
  std::vector<std::string> keys;
  std::vector<Bytes> values;
  MakeKeys("{mig}", 10, 4096, &keys, &values);
  MakeKeys("other", 10, 4096, &keys, &values);
  SetAll(*client, keys, values);
  auto slot = servers.KeySlot("{mig}");
  ASSERT_TRUE(slot.ok());
  auto from = servers.MasterOfSlot(*slot);
  ASSERT_TRUE(from.ok());
  const size_t to = (*from + 1) % 3;

  ASSERT_TRUE(servers.BeginSlotMigration(*slot, *from, to).ok());
  const auto before = client->counters();
  ExpectAllRead(*client, keys, values);
  // A new key in the migrating slot goes to the importing node through ASK too.
  std::vector<std::string> added = {"{mig}/new"};
  std::vector<Bytes> added_values = {RandomBytes(777, 9)};
  SetAll(*client, added, added_values);
  const auto asked = client->counters();
  EXPECT_GE(asked.ask - before.ask, 11u) << "10 GETs, then the SET, each once";
  EXPECT_EQ(asked.moved, before.moved);

  ASSERT_TRUE(servers.FinishSlotMigration(*slot, *from, to).ok());
  auto on_target = servers.Run(to, {"EXISTS", "{mig}/new"});
  ASSERT_TRUE(on_target.ok());
  EXPECT_EQ(on_target->integer, 1)
      << "the SET went to the importing node: " << on_target->ToString();
  ExpectAllRead(*client, keys, values);
  ExpectAllRead(*client, added, added_values);
  const auto moved = client->counters();
  EXPECT_GE(moved.moved - asked.moved, 1u);
  EXPECT_EQ(moved.ask, asked.ask);
  // The map now says where the slot is: no more redirects.
  ExpectAllRead(*client, keys, values);
  EXPECT_EQ(client->counters().moved, moved.moved);
  EXPECT_EQ(client->counters().errors, 0u);
}

TEST(RedisClusterFailover, KilledMasterIsUnavailableThenItsReplicaServes) {
  auto s = RedisServers::StartCluster({});
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  RedisServers& servers = **s;
  RedisClusterOptions o = OptionsFor(servers);
  o.io_timeout = milliseconds(500);
  o.connect_timeout = milliseconds(100);
  auto client = MakeClient(o);
  ASSERT_NE(client, nullptr);
  std::vector<std::string> keys;
  std::vector<Bytes> values;
  MakeKeys("fo", 30, 64 << 10, &keys, &values);
  SetAll(*client, keys, values);
  ASSERT_TRUE(servers.WaitForReplicas(std::chrono::seconds(5)).ok());
  auto victim = servers.MasterOfSlot(RedisCluster::KeySlot(keys[0]));
  ASSERT_TRUE(victim.ok());
  std::vector<bool> on_victim;
  for (const auto& k : keys) {
    auto m = servers.MasterOfSlot(RedisCluster::KeySlot(k));
    ASSERT_TRUE(m.ok());
    on_victim.push_back(*m == *victim);
  }
  servers.Kill(*victim);
  const auto killed_at = Clock::now();

  int victim_failures = 0;
  for (int round = 0; round < 3; ++round) {
    std::vector<Bytes> got;
    const auto start = Clock::now();
    const auto results = GetAll(*client, keys, values, &got);  // checks the bytes of every OK
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
    for (size_t i = 0; i < keys.size(); ++i) {
      // Before node_timeout no replica can have taken over: the victim's keys must fail.
      // (Any OK answer had its bytes checked by GetAll.)
      if (on_victim[i] && Clock::now() - killed_at < milliseconds(1000)) {
        EXPECT_EQ(results[i].code(), StatusCode::kUnavailable) << keys[i];
        ++victim_failures;
        EXPECT_NE(results[i].message().find(servers.endpoint(*victim).ToString()),
                  std::string::npos)
            << results[i].message();
      } else {
        EXPECT_TRUE(results[i].ok() || results[i].code() == StatusCode::kUnavailable)
            << keys[i] << ": " << results[i].ToString();
      }
    }
  }
  EXPECT_GT(victim_failures, 0) << "the batches ran too late to see the master down";
  auto promoted = servers.WaitForFailover(*victim, std::chrono::seconds(20));
  ASSERT_TRUE(promoted.ok()) << promoted.status().ToString();
  // The client finds the new master by its next topology refresh.
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  std::vector<Status> results;
  do {
    std::vector<Bytes> got;
    results = GetAll(*client, keys, values, &got);
    if (std::all_of(results.begin(), results.end(), [](const Status& r) { return r.ok(); })) break;
    std::this_thread::sleep_for(milliseconds(100));
  } while (Clock::now() < deadline);
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_TRUE(results[i].ok()) << keys[i] << ": " << results[i].ToString();
  }
  const auto masters = client->Masters();
  EXPECT_TRUE(std::any_of(masters.begin(), masters.end(), [&](const RedisEndpoint& m) {
    return m.port == servers.port(*promoted);
  }));
}

TEST(RedisClusterStopped, EveryCallIsUnavailableQuicklyThenWorksAfterRestart) {
  RedisServers::ClusterOptions co;
  co.replicas_per_master = 0;
  auto s = RedisServers::StartCluster(co);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  RedisServers& servers = **s;
  RedisClusterOptions o = OptionsFor(servers);
  o.io_timeout = milliseconds(500);
  o.connect_timeout = milliseconds(100);
  auto client = MakeClient(o);
  ASSERT_NE(client, nullptr);
  std::vector<std::string> keys;
  std::vector<Bytes> values;
  MakeKeys("stop", 12, 1024, &keys, &values);
  SetAll(*client, keys, values);
  servers.StopAll();

  for (int round = 0; round < 5; ++round) {
    const auto start = Clock::now();
    std::vector<Bytes> got;
    for (const Status& r : GetAll(*client, keys, values, &got)) {
      EXPECT_EQ(r.code(), StatusCode::kUnavailable) << r.ToString();
    }
    std::vector<RedisCluster::Set> sets(keys.size());
    std::vector<RedisCluster::Exists> exists(keys.size());
    std::vector<RedisCluster::Del> dels(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      sets[i] = {keys[i], values[i], {}};
      exists[i] = {keys[i], false, {}};
      dels[i] = {keys[i], {}};
    }
    client->SetMany(sets);
    client->ExistsMany(exists);
    client->DelMany(dels);
    for (size_t i = 0; i < keys.size(); ++i) {
      EXPECT_EQ(sets[i].result.code(), StatusCode::kUnavailable) << sets[i].result.ToString();
      EXPECT_EQ(exists[i].result.code(), StatusCode::kUnavailable);
      EXPECT_EQ(dels[i].result.code(), StatusCode::kUnavailable);
    }
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(2)) << "round " << round;
  }
  EXPECT_GT(client->counters().connect_failures, 0u);

  ASSERT_TRUE(servers.RestartStopped().ok());
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  bool written = false;
  while (!written && Clock::now() < deadline) {
    std::vector<RedisCluster::Set> sets(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) sets[i] = {keys[i], values[i], {}};
    client->SetMany(sets);
    written = std::all_of(sets.begin(), sets.end(), [](const auto& x) { return x.result.ok(); });
    if (!written) std::this_thread::sleep_for(milliseconds(100));
  }
  ASSERT_TRUE(written) << "no SET succeeded within 10 s of the restart";
  ExpectAllRead(*client, keys, values);
}

}  // namespace
}  // namespace kvtier
