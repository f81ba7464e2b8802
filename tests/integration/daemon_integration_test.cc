// Integration tests of kvtierd as a real process, driven by real client
// processes (kvtier_test_client, kvtier-replay), kvtierctl and an in-process
// kvtier::Client. Each test runs its own daemon in a fresh /tmp directory with
// a 64 MiB arena; every wait is bounded, and DaemonProcess/ChildProcess kill
// what they started even when an assertion fails.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <thread>

#include "daemon_test_fixture.h"
#include "gtest/gtest.h"
#include "kvtier/client.h"
#include "kvtier/gpu/runtime.h"
#include "kvtier/tools/model_presets.h"
#include "kvtier/tools/synthetic_kv.h"
#include "testing/daemon_process.h"

namespace kvtier {
namespace {

using namespace integration;

// ---- (a) two client processes ---------------------------------------------------------

TEST_F(DaemonTest, TwoClientProcessesStoreAndLoadConcurrentlyWithVerifiedBytes) {
  DaemonProcess daemon(Opts());
  ASSERT_EQ(daemon.Start(), "");

  ChildProcess a, b;
  std::string err;
  const auto argv = [&](const char* seed) {
    return std::vector<std::string>{BinPath("kvtier_test_client"),
                                    "store-load",
                                    "--socket",
                                    socket_,
                                    "--seed",
                                    seed,
                                    "--requests",
                                    "60"};
  };
  ASSERT_TRUE(a.Spawn(argv("1"), dir_.Sub("a.out"), dir_.Sub("a.err"), &err)) << err;
  ASSERT_TRUE(b.Spawn(argv("2"), dir_.Sub("b.out"), dir_.Sub("b.err"), &err)) << err;
  const auto ea = a.Wait(90s);
  const auto eb = b.Wait(90s);
  ASSERT_TRUE(ea.has_value()) << "client a still running after 90 s";
  ASSERT_TRUE(eb.has_value()) << "client b still running after 90 s";

  for (const char* name : {"a", "b"}) {
    const auto& e = std::string(name) == "a" ? *ea : *eb;
    const std::string out = ReadFileOrEmpty(dir_.Sub(std::string(name) + ".out"));
    const std::string errs = ReadFileOrEmpty(dir_.Sub(std::string(name) + ".err"));
    SCOPED_TRACE(std::string("client ") + name + ": " + e.ToString() + "\nstdout:\n" + out +
                 "\nstderr:\n" + errs);
    EXPECT_TRUE(e.exited && e.exit_code == 0);
    json r = JsonAfterMarker(out, "RESULT");
    ASSERT_FALSE(r.is_discarded());
    EXPECT_EQ(r["verify_errors"].get<uint64_t>(), 0u);
    EXPECT_EQ(r["fail_open"].get<uint64_t>(), 0u);
    // Each turn extends a conversation, so its earlier chunks must be loaded.
    EXPECT_GT(r["loaded_chunks"].get<uint64_t>(), 0u);
    EXPECT_GT(r["reloaded_chunks"].get<uint64_t>(), 0u);
    EXPECT_GT(r["stored_chunks"].get<uint64_t>(), 0u);
    std::printf("client %s: %s\n", name, r.dump().c_str());
  }

  json s = Stats(daemon);
  ASSERT_FALSE(s.is_discarded());
  EXPECT_EQ(s["active_leases"], 0);
  EXPECT_EQ(s["active_reservations"], 0);
  EXPECT_GT(s["tiers"][0]["write_bytes"].get<uint64_t>(), 0u);
  EXPECT_GT(s["tiers"][0]["hits"].get<uint64_t>(), 0u);
  EXPECT_GT(s["hit_tokens"].get<uint64_t>(), 0u);
}

TEST_F(DaemonTest, TwoReplayProcessesReportNoVerifyErrors) {
  DaemonProcess daemon(Opts());
  ASSERT_EQ(daemon.Start(), "");
  ChildProcess a, b;
  std::string err;
  const auto argv = [&](const char* json_name) {
    return std::vector<std::string>{
        BinPath("kvtier-replay"), "--socket", socket_,  "--generate",       "40", "--quiet",
        "--deadline-ms",          "2000",     "--json", dir_.Sub(json_name)};
  };
  ASSERT_TRUE(a.Spawn(argv("a.json"), dir_.Sub("a.out"), dir_.Sub("a.out"), &err)) << err;
  ASSERT_TRUE(b.Spawn(argv("b.json"), dir_.Sub("b.out"), dir_.Sub("b.out"), &err)) << err;
  const auto ea = a.Wait(90s);
  const auto eb = b.Wait(90s);
  ASSERT_TRUE(ea && eb) << "kvtier-replay still running after 90 s";
  for (const char* name : {"a", "b"}) {
    const auto& e = std::string(name) == "a" ? *ea : *eb;
    const std::string out = ReadFileOrEmpty(dir_.Sub(std::string(name) + ".out"));
    SCOPED_TRACE(std::string("replay ") + name + ": " + e.ToString() + "\n" + out);
    EXPECT_TRUE(e.exited && e.exit_code == 0);
    json r = json::parse(ReadFileOrEmpty(dir_.Sub(std::string(name) + ".json")), nullptr, false);
    ASSERT_FALSE(r.is_discarded());
    EXPECT_EQ(r["requests"], 40);
    EXPECT_EQ(r["verify_errors"], 0);
    EXPECT_EQ(r["fail_open"], 0);
    EXPECT_GT(r["chunks_loaded"].get<uint64_t>(), 0u);
  }
}

// ---- (b) a killed client's session ---------------------------------------------------

TEST_F(DaemonTest, KilledClientsLeasesAndReservationsEndWithItsSessionNotItsTtl) {
  // TTLs of 10 minutes: anything freed within seconds was freed by the session's end.
  DaemonProcess daemon(Opts({"--lease-ttl-ms", "600000", "--reservation-ttl-ms", "600000"}));
  ASSERT_EQ(daemon.Start(), "");

  ChildProcess holder;
  const json held = SpawnHolder(holder);
  ASSERT_FALSE(held.is_discarded());
  const uint64_t slot = held["slot_bytes"].get<uint64_t>();
  const uint64_t stored = held["stored_chunks"].get<uint64_t>();
  const uint64_t reserved = held["reserved_chunks"].get<uint64_t>();
  ASSERT_GT(slot, 0u);
  ASSERT_GT(stored, 0u);
  ASSERT_GT(reserved, 0u);

  json before = Stats(daemon);
  ASSERT_FALSE(before.is_discarded());
  EXPECT_EQ(before["active_leases"], 1);
  EXPECT_EQ(before["active_reservations"], 1);
  EXPECT_EQ(before["tiers"][0]["used_bytes"].get<uint64_t>(), (stored + reserved) * slot);

  holder.Kill();
  const auto killed = Clock::now();
  json after;
  const bool released = WaitFor(
      [&] {
        after = Stats(daemon);
        // The reserved slots come back once kvtierd sees the process gone (its 50 ms sweep):
        // until then its copies could still land in them.
        return !after.is_discarded() && after["active_leases"] == 0 &&
               after["active_reservations"] == 0 &&
               after["tiers"][0]["used_bytes"].get<uint64_t>() == stored * slot;
      },
      3s, 10ms);
  const int64_t took_ms = MsSince(killed);
  std::printf("leases and reservations released %lld ms after SIGKILL\n",
              static_cast<long long>(took_ms));
  ASSERT_TRUE(released) << "still held 3 s after the client died (TTL is 600 s): " << after.dump();
  EXPECT_EQ(after["sessions"], 0);
  // The reserved slots are free again; the committed prompt stays cached.
  EXPECT_EQ(after["tiers"][0]["used_bytes"].get<uint64_t>(), stored * slot);
  EXPECT_EQ(after["tiers"][0]["chunks"].get<uint64_t>(), stored);
  EXPECT_TRUE(daemon.running());
}

// ---- (c) the daemon dies under an in-process client ------------------------------------

TEST_F(DaemonTest, ClientFailsOpenWhileDaemonIsDownThenReconnectsAndRemaps) {
  DaemonProcess daemon(Opts());
  ASSERT_EQ(daemon.Start(), "");
  json health1 = ParseJson(daemon.Ctl({"--json", "health"}));
  ASSERT_FALSE(health1.is_discarded());

  ClientOptions copts;
  copts.socket_path = socket_;
  copts.deadline = 100ms;
  copts.reconnect_interval = 100ms;
  auto client_or = Client::Connect(copts);
  ASSERT_TRUE(client_or.ok()) << client_or.status().ToString();
  auto client = std::move(client_or).value();
  ASSERT_TRUE(client->connected());
  auto spec = tools::ModelPreset("tiny", 128);
  ASSERT_TRUE(spec.ok());
  auto ns_or = client->OpenNamespace(*spec);
  ASSERT_TRUE(ns_or.ok()) << ns_or.status().ToString();
  const NamespaceHandle ns = *ns_or;
  const uint64_t pb = ns.layout.payload_bytes;

  auto prompt = [&](int32_t base, size_t n) {
    std::vector<int32_t> t(n);
    for (size_t i = 0; i < n; ++i) t[i] = base + static_cast<int32_t>(i * 7 % 1000);
    return t;
  };
  auto store = [&](const std::vector<int32_t>& tokens) {
    const auto keys = Client::ChunkKeys(ns, tokens);
    return client->Store(ns, tokens, [&](size_t i, std::span<std::byte> p) {
      tools::FillPayload(keys[i], spec->num_layers, p);
      return Status::Ok();
    });
  };
  // Loads `tokens` and returns the number of verified chunks (-1 on a bad byte).
  auto load_verified = [&](const std::vector<int32_t>& tokens) -> int64_t {
    const auto keys = Client::ChunkKeys(ns, tokens);
    std::vector<std::byte> buf(keys.size() * pb);
    auto r = client->Load(ns, tokens, buf);
    if (!r.ok() || !r->fail_open.ok()) return 0;
    for (uint32_t i = 0; i < r->num_chunks; ++i) {
      if (tools::CountPayloadErrors(keys[i], spec->num_layers,
                                    std::span<const std::byte>(buf.data() + i * pb, pb)) != 0) {
        return -1;
      }
    }
    return r->num_chunks;
  };

  const auto a = prompt(1000, 4 * 128 + 5);
  auto sa = store(a);
  ASSERT_TRUE(sa.ok() && sa->fail_open.ok()) << sa->fail_open.ToString();
  ASSERT_EQ(sa->stored_chunks, 4u);
  ASSERT_EQ(load_verified(a), 4);

  ASSERT_TRUE(daemon.Kill9().term_signal == SIGKILL);

  // Down: every call fails open, fast.
  const auto b = prompt(5000, 3 * 128);
  int64_t worst_ms = 0;
  for (int i = 0; i < 10; ++i) {
    auto t0 = Clock::now();
    auto l = client->Lookup(ns, a);
    const int64_t lookup_ms = MsSince(t0);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    EXPECT_EQ(l->cached_tokens, 0u);
    EXPECT_EQ(l->num_chunks, 0u);
    EXPECT_FALSE(l->fail_open.ok());
    EXPECT_FALSE(l->fail_open.message().empty());

    t0 = Clock::now();
    auto s = store(b);
    const int64_t store_ms = MsSince(t0);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ(s->stored_chunks, 0u);
    EXPECT_FALSE(s->fail_open.ok());

    t0 = Clock::now();
    std::vector<std::byte> buf(4 * pb);
    auto ld = client->Load(ns, a, buf);
    const int64_t load_ms = MsSince(t0);
    ASSERT_TRUE(ld.ok()) << ld.status().ToString();
    EXPECT_EQ(ld->loaded_tokens, 0u);
    EXPECT_FALSE(ld->fail_open.ok());

    EXPECT_LT(lookup_ms, 1000);
    EXPECT_LT(store_ms, 1000);
    EXPECT_LT(load_ms, 1000);
    worst_ms = std::max({worst_ms, lookup_ms, store_ms, load_ms});
    std::this_thread::sleep_for(30ms);  // let reconnection attempts happen in between
  }
  std::printf("daemon down: slowest fail-open call took %lld ms (deadline 100 ms)\n",
              static_cast<long long>(worst_ms));
  EXPECT_FALSE(client->connected());

  // Up again on the same socket (stale socket files from the SIGKILL).
  ASSERT_EQ(daemon.Start(), "");
  json health2 = ParseJson(daemon.Ctl({"--json", "health"}));
  ASSERT_FALSE(health2.is_discarded());
  EXPECT_NE(health1["epoch"], health2["epoch"]);

  const auto t_up = Clock::now();
  bool stored_again = false;
  ASSERT_TRUE(WaitFor(
      [&] {
        auto s = store(b);
        stored_again = s.ok() && s->fail_open.ok() && s->stored_chunks == 3;
        return stored_again;
      },
      15s, 50ms))
      << "the client did not reconnect within 15 s of the restart";
  std::printf("client stored again %lld ms after the daemon was serving\n",
              static_cast<long long>(MsSince(t_up)));
  EXPECT_TRUE(client->connected());
  // New arena (new epoch): the bytes read back are the ones just written.
  EXPECT_EQ(load_verified(b), 3);
  // The old daemon's DRAM is gone: a clean miss, not a failure.
  auto la = client->Lookup(ns, a);
  ASSERT_TRUE(la.ok());
  EXPECT_TRUE(la->fail_open.ok()) << la->fail_open.ToString();
  EXPECT_EQ(la->cached_tokens, 0u);
  json s = Stats(daemon);
  ASSERT_FALSE(s.is_discarded());
  EXPECT_EQ(s["sessions"], 1);
  EXPECT_EQ(s["tiers"][0]["chunks"], 3);
}

// ---- (d) one daemon per socket --------------------------------------------------------

// A TCP socket bound to 127.0.0.1:`port` (0: any free port), or -1.
int BindLoopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(fd, 1) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

int FreeLoopbackPort() {
  const int fd = BindLoopback(0);
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// A review found two kvtierd started on one metrics address, each scraped at
// random (cpp-httplib sets SO_REUSEPORT): a scrape mixed two daemons' figures.
TEST_F(DaemonTest, AMetricsAddressInUseRefusesTheStartThatGaveIt) {
  const std::string address = "127.0.0.1:" + std::to_string(FreeLoopbackPort());
  DaemonProcess daemon(Opts({"--metrics-address", address}));
  ASSERT_EQ(daemon.Start(), "");
  CommandResult second =
      RunCommand({BinPath("kvtierd"), "--socket", dir_.Sub("b.sock"), "--dram-bytes", "64MiB",
                  "--nvme-bytes", "0", "--metrics-address", address},
                 20s);
  EXPECT_TRUE(second.exit.exited && second.exit.exit_code == 1) << second.Describe();
  EXPECT_NE(
      second.err.find("kvtierd: cannot start: --metrics-address " + address + ": cannot listen"),
      std::string::npos)
      << second.Describe();
  EXPECT_TRUE(daemon.running());
  EXPECT_FALSE(Exists(dir_.Sub("b.sock"))) << "the refused daemon left its socket";
}

// The default address (127.0.0.1:9400) taken, as by a second kvtierd on the
// machine: the daemon serves without metrics and says so.
TEST_F(DaemonTest, TheDefaultMetricsAddressInUseLeavesMetricsOffWithAWarning) {
  // Hold 9400 ourselves; when another process (another kvtierd) holds it, it
  // is taken all the same.
  const int held = BindLoopback(9400);
  DaemonProcess::Options o = Opts();
  o.metrics_off = false;
  DaemonProcess daemon(o);
  ASSERT_EQ(daemon.Start(), "");
  EXPECT_TRUE(daemon.Ctl({"health"}).ok());
  daemon.Stop();
  if (held >= 0) close(held);
  EXPECT_NE(daemon.log().find("metrics off: cannot listen on 127.0.0.1:9400"), std::string::npos)
      << daemon.log();
}

TEST_F(DaemonTest, SecondDaemonOnSameSocketIsRefusedAndFirstKeepsServing) {
  DaemonProcess daemon(Opts());
  ASSERT_EQ(daemon.Start(), "");
  CommandResult second =
      RunCommand({BinPath("kvtierd"), "--socket", socket_, "--dram-bytes", "64MiB"}, 20s);
  EXPECT_FALSE(second.timed_out) << second.Describe();
  EXPECT_TRUE(second.exit.exited) << second.Describe();
  EXPECT_NE(second.exit.exit_code, 0) << second.Describe();
  const std::string msg = second.out + second.err;
  EXPECT_NE(msg.find("another kvtierd"), std::string::npos) << msg;
  EXPECT_NE(msg.find(socket_ + ".lock"), std::string::npos) << msg;

  EXPECT_TRUE(daemon.running());
  // The refused daemon must leave the first one's socket files alone.
  EXPECT_TRUE(Exists(socket_)) << "gRPC socket removed by the refused daemon";
  EXPECT_TRUE(Exists(socket_ + ".arena")) << "arena socket removed by the refused daemon";
  CommandResult h = daemon.Ctl({"--json", "health"});
  EXPECT_TRUE(h.ok()) << h.Describe();
  json hj = ParseJson(h);
  ASSERT_FALSE(hj.is_discarded()) << h.Describe();
  EXPECT_EQ(hj["pid"], daemon.pid());
  CommandResult c = StoreLoad("3", "4");
  EXPECT_TRUE(c.ok()) << c.Describe();
}

// ---- (f) start-up errors and the socket directory ---------------------------------------

// Runs kvtierd with `args` and expects a clean refusal naming `needle`.
void ExpectStartupError(const std::vector<std::string>& args, const std::string& needle) {
  std::vector<std::string> argv = {BinPath("kvtierd")};
  argv.insert(argv.end(), args.begin(), args.end());
  CommandResult r = RunCommand(argv, 20s);
  EXPECT_FALSE(r.timed_out) << r.Describe();
  // Exited by itself (not a crash or abort) with a nonzero code.
  EXPECT_TRUE(r.exit.exited) << r.Describe();
  EXPECT_NE(r.exit.exit_code, 0) << r.Describe();
  EXPECT_NE((r.out + r.err).find(needle), std::string::npos)
      << "message does not name '" << needle << "': " << r.Describe();
}

// Issue 10, item 13: a tier too small for a real model's chunk started without a word.
TEST_F(DaemonTest, TiersTooSmallForARealChunkAreWarnedAbout) {
  DaemonProcess::Options o = Opts({"--nvme-path", dir_.path(), "--nvme-bytes", "64KiB"});
  o.dram_bytes = "256KiB";
  DaemonProcess daemon(o);
  ASSERT_EQ(daemon.Start(), "");
  const std::string log = ReadFileOrEmpty(dir_.Sub("kvtierd.log"));
  EXPECT_NE(log.find("dram_bytes 262144 is less than 1 MiB"), std::string::npos) << log;
  EXPECT_NE(log.find("nvme_bytes 65536 is less than 1 MiB"), std::string::npos) << log;
}

// kvtier-bench dram and peers found it: once the arena was full of one namespace's prefix
// chains (256 KiB chunks, 4 a request), a store of another namespace's 1 MiB chunks stored
// 0 of them and said OK, so each benchmark exited 1. The benchmarks verify every byte.
TEST_F(DaemonTest, AnArenaFullOfOneSizesChainsStillTakesABiggerSize) {
  // One request of 4 chunks of 4 MiB is more than the default session limit (half the arena).
  DaemonProcess::Options o = Opts({"--session-max-bytes", "32MiB"});
  o.dram_bytes = "32MiB";
  DaemonProcess daemon(o);
  ASSERT_EQ(daemon.Start(), "");
  const CommandResult dram = RunCommand(
      // --socket after the subcommand, as kvtierctl takes it (once refused: exit 2)
      {BinPath("kvtier-bench"), "dram", "--socket", socket_, "--iterations", "2", "--chunks", "4"},
      120s);
  EXPECT_TRUE(dram.ok()) << dram.Describe();
  EXPECT_NE(dram.out.find("4.0 MiB"), std::string::npos) << dram.Describe();
  // A mistyped benchmark is named (it was only "A subcommand is required").
  CommandResult bogus = RunCommand({BinPath("kvtier-bench"), "--socket", socket_, "bogus"}, 30s);
  EXPECT_TRUE(bogus.exit.exited && bogus.exit.exit_code == 2) << bogus.Describe();
  EXPECT_NE(bogus.err.find("'bogus' is not a command"), std::string::npos) << bogus.Describe();
  // Redis and Mooncake Store are started by the benchmark (make deps installs redis-server,
  // and Mooncake in the `peers` venv). Each verifies every byte it gets back.
  const CommandResult peers = RunCommand(
      {BinPath("kvtier-bench"), "--socket", socket_, "peers", "--iterations", "1", "--chunks", "2"},
      180s);
  EXPECT_TRUE(peers.ok()) << peers.Describe();
  for (const char* row : {"4.0 MiB   kvtier", "4.0 MiB   Redis", "4.0 MiB   Mooncake"}) {
    EXPECT_NE(peers.out.find(row), std::string::npos) << row << "\n" << peers.Describe();
  }
}

// A review found --session-max-bytes above --dram-bytes, or below one slot,
// starting without a word.
TEST_F(DaemonTest, ASessionLimitThatCannotBindIsWarnedAbout) {
  DaemonProcess::Options o = Opts({"--session-max-bytes", "128MiB"});
  o.dram_bytes = "64MiB";
  DaemonProcess daemon(o);
  ASSERT_EQ(daemon.Start(), "");
  const std::string log = ReadFileOrEmpty(dir_.Sub("kvtierd.log"));
  EXPECT_NE(log.find("session_max_bytes 134217728 is more than dram_bytes 67108864"),
            std::string::npos)
      << log;
  daemon.Stop();

  // 64 KiB is less than one slot of the replay's namespace (a 256-token chunk).
  o.extra_args = {"--session-max-bytes", "64KiB"};
  DaemonProcess small(o);
  ASSERT_EQ(small.Start(), "");
  CommandResult r = RunCommand(
      {BinPath("kvtier-replay"), "--socket", socket_, "--generate", "2", "--quiet"}, 60s);
  EXPECT_TRUE(r.ok()) << r.Describe();
  const std::string small_log = ReadFileOrEmpty(dir_.Sub("kvtierd.log"));
  EXPECT_NE(small_log.find("less than one slot"), std::string::npos) << small_log;
}

TEST_F(DaemonTest, StartupRejectsBadDramBytes) {
  ExpectStartupError({"--socket", socket_, "--dram-bytes", "12XB"}, "--dram-bytes");
  ExpectStartupError({"--socket", socket_, "--dram-bytes", "lots"}, "--dram-bytes");
  ExpectStartupError({"--socket", socket_, "--dram-bytes", "1000"}, "--dram-bytes 1000");
  EXPECT_FALSE(Exists(socket_));
}

TEST_F(DaemonTest, StartupWithAnHbmTierButNoGpuSaysSoAndHowToTurnItOff) {
  std::unique_ptr<gpu::Runtime> cuda;
  if (gpu::Runtime::CreateCuda(0, &cuda).ok()) GTEST_SKIP() << "a GPU is present";
  const std::vector<std::string> base = {"--socket", socket_,        "--dram-bytes",
                                         "64MiB",    "--nvme-bytes", "0"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), base.begin(), base.end());
    return more;
  };
  ExpectStartupError(with({"--hbm-bytes", "64MiB"}), "--hbm-bytes needs a CUDA GPU");
  ExpectStartupError(with({"--hbm-bytes", "64MiB"}), "without --hbm-bytes");
  ExpectStartupError(with({"--hbm-bytes", "5000", "--gpu-backend", "host"}), "--hbm-bytes 5000");
  ExpectStartupError(with({"--hbm-bytes", "64MiB", "--gpu-backend", "tpu"}), "'tpu'");
  ExpectStartupError(with({"--hbm-bytes", "64MiB", "--gpu", "-1"}), "gpu -1");
  EXPECT_FALSE(Exists(socket_));
  // With an NVMe tier too: the GPU is checked first, so no slot file is made.
  const std::string nvme = dir_.Sub("nvme");
  ASSERT_TRUE(std::filesystem::create_directory(nvme));
  ExpectStartupError({"--socket", socket_, "--dram-bytes", "64MiB", "--nvme-path", nvme,
                      "--nvme-bytes", "64MiB", "--hbm-bytes", "64MiB"},
                     "--hbm-bytes needs a CUDA GPU");
  EXPECT_FALSE(Exists(nvme + "/kvtier-slots.dat")) << "a slot file was preallocated first";
}

TEST_F(DaemonTest, StartupRejectsUnknownLogLevel) {
  ExpectStartupError({"--socket", socket_, "--dram-bytes", "64MiB", "--log-level", "loud"}, "loud");
  EXPECT_FALSE(Exists(socket_));
}

TEST_F(DaemonTest, StartupRejectsUnknownConfigKey) {
  const std::string cfg = dir_.Sub("kvtierd.yaml");
  ASSERT_TRUE(testing::WriteFile(cfg, "dram_bytes: 64MiB\nbogus_key: 3\n"));
  ExpectStartupError({"--socket", socket_, "--config", cfg}, "bogus_key");
  EXPECT_FALSE(Exists(socket_));
}

TEST_F(DaemonTest, StartupRejectsConfigWithBadValueButAcceptsAGoodOne) {
  const std::string bad = dir_.Sub("bad.yaml");
  ASSERT_TRUE(testing::WriteFile(bad, "dram_bytes: 7 apples\n"));
  ExpectStartupError({"--socket", socket_, "--config", bad}, "dram");

  const std::string good = dir_.Sub("good.yaml");
  ASSERT_TRUE(testing::WriteFile(good, "dram_bytes: 8MiB\nlog_level: warn\n"));
  DaemonProcess::Options o = Opts({"--config", good});
  o.dram_bytes = "32MiB";  // the flag wins over the file
  DaemonProcess daemon(o);
  ASSERT_EQ(daemon.Start(), "");
  json s = Stats(daemon);
  ASSERT_FALSE(s.is_discarded());
  EXPECT_EQ(s["tiers"][0]["capacity_bytes"], 32u << 20);
}

TEST_F(DaemonTest, SocketDirectoryIsCreatedWithMode0700) {
  const std::string nested = dir_.Sub("a/kvtierd.sock");
  DaemonProcess::Options o = Opts();
  o.socket_path = nested;
  DaemonProcess daemon(o);
  ASSERT_EQ(daemon.Start(), "");
  struct stat st;
  ASSERT_EQ(stat(dir_.Sub("a").c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0700u) << std::oct << (st.st_mode & 07777);
  EXPECT_EQ(st.st_uid, geteuid());
  ASSERT_EQ(lstat(nested.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  ASSERT_EQ(lstat((nested + ".arena").c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
}

// kvtierd creates the socket's own directory, not a chain of missing parents
// (a typo in --socket must not create directories all over the file system).
TEST_F(DaemonTest, MissingParentOfTheSocketDirectoryIsAnError) {
  CommandResult r = RunCommand({BinPath("kvtierd"), "--socket", dir_.Sub("x/y/kvtierd.sock")}, 10s);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.err.find("does not exist"), std::string::npos) << r.Describe();
  struct stat st;
  EXPECT_NE(stat(dir_.Sub("x").c_str(), &st), 0) << "a parent directory was created";
}

// A review found errors kvtierd finds at start naming a flag never given (the
// config file's socket_group) or nothing at all (its nvme_paths). A later one
// found them printed as log lines with a status code in front, where errors
// found while parsing are `kvtierd: ...` lines: each is now `kvtierd: cannot
// start: ...`, and still exits 1 (2 is for what cannot be read).
TEST_F(DaemonTest, StartErrorsNameTheConfigFileLineOfTheirSetting) {
  const std::string cfg = dir_.Sub("kvtierd.yaml");
  ASSERT_TRUE(testing::WriteFile(cfg, "dram_bytes: 64MiB\nsocket_group: no-such-group-kvt\n"));
  CommandResult g = RunCommand({BinPath("kvtierd"), "--socket", dir_.Sub("s/kvtierd.sock"),
                                "--config", cfg, "--nvme-bytes", "0"},
                               10s);
  EXPECT_FALSE(g.ok());
  EXPECT_NE(g.err.find("kvtierd: cannot start: config " + cfg +
                       ":2: socket_group "
                       "'no-such-group-kvt' is not a known group"),
            std::string::npos)
      << g.Describe();
  EXPECT_TRUE(g.exit.exited && g.exit.exit_code == 1) << g.Describe();
  ASSERT_TRUE(testing::WriteFile(cfg,
                                 "dram_bytes: 64MiB\nnvme_bytes: 16MiB\n"
                                 "nvme_paths: " +
                                     dir_.Sub("missing") + "\n"));
  CommandResult n = RunCommand(
      {BinPath("kvtierd"), "--socket", dir_.Sub("s/kvtierd.sock"), "--config", cfg}, 10s);
  EXPECT_FALSE(n.ok());
  EXPECT_NE(n.err.find("config " + cfg + ":3: nvme_paths: NVMe path"), std::string::npos)
      << n.Describe();
  CommandResult f = RunCommand({BinPath("kvtierd"), "--socket", dir_.Sub("s/kvtierd.sock"),
                                "--nvme-bytes", "16MiB", "--nvme-path", dir_.Sub("gone")},
                               10s);
  EXPECT_FALSE(f.ok());
  EXPECT_NE(f.err.find("kvtierd: cannot start: --nvme-path: NVMe path"), std::string::npos)
      << f.Describe();
  EXPECT_EQ(f.err.find("INVALID_ARGUMENT"), std::string::npos) << f.Describe();
}

// A review found a refused start leaving the socket directory it had made.
TEST_F(DaemonTest, ARefusedStartRemovesTheSocketDirectoryItMade) {
  const std::string made = dir_.Sub("run-kvtier");
  CommandResult r =
      RunCommand({BinPath("kvtierd"), "--socket", made + "/kvtierd.sock", "--nvme-path",
                  dir_.Sub("no-such-dir/nvme"), "--nvme-bytes", "64MiB"},
                 10s);
  EXPECT_FALSE(r.ok()) << r.Describe();
  EXPECT_FALSE(Exists(made)) << "a refused start leaves no directory it made";

  // A directory that was there before stays, with whatever else it holds.
  ASSERT_EQ(mkdir(made.c_str(), 0700), 0);
  ASSERT_TRUE(kvtier::testing::WriteFile(made + "/keep.txt", "mine"));
  r = RunCommand({BinPath("kvtierd"), "--socket", made + "/kvtierd.sock", "--nvme-path",
                  dir_.Sub("no-such-dir/nvme"), "--nvme-bytes", "64MiB"},
                 10s);
  EXPECT_FALSE(r.ok()) << r.Describe();
  EXPECT_EQ(ReadFileOrEmpty(made + "/keep.txt"), "mine");
  EXPECT_FALSE(Exists(made + "/kvtierd.sock.lock"));
}

// Whatever sits at the socket path and is not a socket is not kvtierd's to delete.
TEST_F(DaemonTest, FileAtTheSocketPathIsNeverRemoved) {
  const std::string path = dir_.Sub("notes.txt");
  ASSERT_TRUE(kvtier::testing::WriteFile(path, "precious"));
  CommandResult r = RunCommand({BinPath("kvtierd"), "--socket", path}, 10s);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.err.find("not a socket"), std::string::npos) << r.Describe();
  EXPECT_EQ(ReadFileOrEmpty(path), "precious");
  EXPECT_FALSE(Exists(path + ".lock")) << "a refused start leaves no lock file";
}

// The same for the socket's companions, `<socket>.arena` and `<socket>.ring`.
TEST_F(DaemonTest, FileAtACompanionSocketPathIsNeverRemoved) {
  for (const char* suffix : {".arena", ".ring"}) {
    const std::string sock = dir_.Sub(std::string("c") + suffix + "/kvtierd.sock");
    ASSERT_EQ(mkdir(dir_.Sub(std::string("c") + suffix).c_str(), 0700), 0);
    const std::string path = sock + suffix;
    ASSERT_TRUE(kvtier::testing::WriteFile(path, "precious"));
    CommandResult r = RunCommand({BinPath("kvtierd"), "--socket", sock, "--nvme-bytes", "0"}, 10s);
    EXPECT_FALSE(r.ok()) << suffix;
    EXPECT_NE(r.err.find(path + " exists and is not a socket"), std::string::npos) << r.Describe();
    EXPECT_EQ(ReadFileOrEmpty(path), "precious") << suffix;
  }
}

// A socket some other program is listening on is not a dead daemon's leftover.
TEST_F(DaemonTest, LiveSocketOfAnotherProgramIsNeverReplaced) {
  const std::string path = dir_.Sub("other.sock");
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  CommandResult r = RunCommand({BinPath("kvtierd"), "--socket", path}, 10s);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.err.find("listening"), std::string::npos) << r.Describe();
  struct stat st;
  EXPECT_EQ(lstat(path.c_str(), &st), 0) << "the other program's socket was removed";
  close(fd);
}

// A socket placed directly in an existing shared directory (think --socket
// /tmp/kvtierd.sock) must not change that directory's permissions: kvtierd
// either leaves it alone or refuses to start.
TEST_F(DaemonTest, ExistingParentDirectoryModeIsNotChanged) {
  const std::string shared = dir_.Sub("shared");
  ASSERT_EQ(mkdir(shared.c_str(), 0755), 0);
  ASSERT_EQ(chmod(shared.c_str(), 0755), 0);  // regardless of the umask
  DaemonProcess::Options o = Opts();
  o.socket_path = shared + "/kvtierd.sock";
  o.start_timeout = 10s;
  DaemonProcess daemon(o);
  const std::string started = daemon.Start();
  struct stat st;
  ASSERT_EQ(stat(shared.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0755u)
      << "kvtierd changed the mode of the pre-existing directory " << shared << " to 0" << std::oct
      << (st.st_mode & 07777) << " (started: " << (started.empty() ? "yes" : started) << ")";
}

// ---- (g) kvtier-replay input errors -------------------------------------------------------

TEST_F(DaemonTest, ReplayOnMalformedTraceNamesTheLine) {
  const std::string trace = dir_.Sub("trace.jsonl");
  ASSERT_TRUE(testing::WriteFile(
      trace,
      "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 10, \"hash_ids\": [1, 2]}\n"
      "{\"timestamp\": 5, \"input_length\": 100, \"output_length\": 10, \"hash_ids\": [1]}\n"
      "{\"timestamp\": 9, \"input_length\": 600, \"output_length\"\n"
      "{\"timestamp\": 12, \"input_length\": 100, \"output_length\": 10, \"hash_ids\": [3]}\n"));
  // No daemon needed: the trace is read before connecting. A negative --limit
  // used to wrap around to "all requests".
  for (const char* bad : {"-5", "-1"}) {
    CommandResult l = RunCommand(
        {BinPath("kvtier-replay"), "--socket", socket_, "--trace", trace, "--limit", bad}, 30s);
    EXPECT_TRUE(l.exit.exited && l.exit.exit_code == 2) << l.Describe();
    EXPECT_NE(l.err.find("--limit"), std::string::npos) << l.Describe();
    EXPECT_NE(l.err.find(std::string(bad) + " is negative"), std::string::npos) << l.Describe();
    EXPECT_LT(l.err.size(), 200u) << "the message once printed DBL_MAX in full: " << l.Describe();
  }
  CommandResult g =
      RunCommand({BinPath("kvtier-replay"), "--socket", socket_, "--generate", "-3"}, 30s);
  EXPECT_TRUE(g.exit.exited && g.exit.exit_code == 2) << g.Describe();
  EXPECT_NE(g.err.find("--generate: -3 is negative"), std::string::npos) << g.Describe();
  // --limit was silently ignored beside --generate; a count past 1,000,000 (or
  // past uint64) grew memory without bound before anything was printed.
  for (const std::vector<std::string>& bad :
       {std::vector<std::string>{"--generate", "50", "--limit", "10"},
        std::vector<std::string>{"--generate", "100000000"},
        std::vector<std::string>{"--generate", "99999999999999999999"},
        std::vector<std::string>{"--generate", "0"}}) {
    std::vector<std::string> cmd = {BinPath("kvtier-replay"), "--socket", socket_};
    cmd.insert(cmd.end(), bad.begin(), bad.end());
    CommandResult b = RunCommand(cmd, 30s);
    EXPECT_TRUE(b.exit.exited && b.exit.exit_code == 2) << b.Describe();
    EXPECT_NE(b.err.find("--generate"), std::string::npos) << b.Describe();
  }
  CommandResult r =
      RunCommand({BinPath("kvtier-replay"), "--socket", socket_, "--trace", trace}, 30s);
  EXPECT_TRUE(r.exit.exited) << r.Describe();
  EXPECT_NE(r.exit.exit_code, 0) << r.Describe();
  EXPECT_NE(r.err.find(trace + ":3:"), std::string::npos) << r.Describe();

  // A well-formed line with a wrong block count is named as well.
  ASSERT_TRUE(testing::WriteFile(
      trace,
      "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 10, \"hash_ids\": [1, 2]}\n"
      "{\"timestamp\": 1, \"input_length\": 600, \"output_length\": 10, \"hash_ids\": [1, 2]}\n"
      "{\"timestamp\": 2, \"input_length\": 600, \"output_length\": 10, \"hash_ids\": [1]}\n"));
  r = RunCommand({BinPath("kvtier-replay"), "--socket", socket_, "--trace", trace}, 30s);
  EXPECT_TRUE(r.exit.exited && r.exit.exit_code != 0) << r.Describe();
  EXPECT_NE(r.err.find(trace + ":3:"), std::string::npos) << r.Describe();
  EXPECT_NE(r.err.find("hash_ids"), std::string::npos) << r.Describe();
}

// ---- (h) clean shutdown ---------------------------------------------------------------

TEST_F(DaemonTest, SigtermShutsDownCleanlyAndRemovesTheSockets) {
  DaemonProcess daemon(Opts());
  ASSERT_EQ(daemon.Start(), "");
  // With a connected client holding a session, too.
  ClientOptions copts;
  copts.socket_path = socket_;
  copts.deadline = 1000ms;
  auto client = Client::Connect(copts);
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->connected());
  ASSERT_TRUE(Exists(socket_));
  ASSERT_TRUE(Exists(socket_ + ".arena"));

  const auto t0 = Clock::now();
  const ExitInfo e = daemon.Stop();
  std::printf("kvtierd stopped %lld ms after SIGTERM\n", static_cast<long long>(MsSince(t0)));
  EXPECT_TRUE(e.exited) << e.ToString();
  EXPECT_EQ(e.exit_code, 0) << e.ToString();
  EXPECT_FALSE(Exists(socket_));
  EXPECT_FALSE(Exists(socket_ + ".arena"));
  EXPECT_NE(daemon.log().find("SIGTERM"), std::string::npos) << daemon.log();
  // The client notices and fails open.
  EXPECT_TRUE(WaitFor([&] { return !(*client)->connected(); }, 5s));
  // The socket path is free for the next daemon.
  ASSERT_EQ(daemon.Start(), "");
}

}  // namespace
}  // namespace kvtier
