// kvtierctl ls, flush, stats --watch, config and completion against a real
// kvtierd (issue 12), with their usage errors, and evict's audit line naming
// the caller's uid.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <string>

#include "daemon_test_fixture.h"
#include "testing/test_client_common.h"

namespace kvtier {
namespace {

using namespace integration;
using testclient::AppendTokens;

bool ExitedWith(const CommandResult& r, int code) {
  return r.exit.exited && r.exit.exit_code == code;
}

// The one namespace kvtier_test_client stores into ("tiny", 128-token chunks).
json OnlyNamespace(DaemonProcess& daemon) {
  json nj = ParseJson(daemon.Ctl({"--json", "namespaces"}));
  EXPECT_EQ(nj["namespaces"].size(), 1u) << nj.dump();
  return nj["namespaces"].size() == 1 ? nj["namespaces"][0] : json();
}

TEST_F(DaemonTest, KvtierctlLsListsTheStoredChunksWithTheirTierSizeAndHits) {
  DaemonProcess daemon(Opts());
  ASSERT_EQ(daemon.Start(), "");
  const auto started = Clock::now();
  CommandResult c = StoreLoad("5", "4");
  ASSERT_TRUE(c.ok()) << c.Describe();
  const json ns = OnlyNamespace(daemon);
  ASSERT_TRUE(ns.is_object());
  const std::string id = ns["namespace_id"];
  const uint64_t num_chunks = ns["chunks"];
  ASSERT_GT(num_chunks, 2u);
  // tiny: fp16 (2 bytes), mha: [layers][K,V][chunk_tokens][heads][head_dim].
  ASSERT_EQ(ns["kv_dtype"], "fp16");
  const uint64_t payload = 2ull * 2 * ns["num_layers"].get<uint64_t>() *
                           ns["chunk_tokens"].get<uint64_t>() * ns["num_kv_heads"].get<uint64_t>() *
                           ns["head_dim"].get<uint64_t>();

  // ls with no argument is the namespace listing.
  json all = ParseJson(daemon.Ctl({"--json", "ls"}));
  ASSERT_EQ(all["namespaces"].size(), 1u) << all.dump();
  EXPECT_EQ(all["namespaces"][0]["namespace_id"], id);

  CommandResult l = daemon.Ctl({"--json", "ls", "--namespace", id});
  ASSERT_TRUE(l.ok()) << l.Describe();
  json lj = ParseJson(l);
  ASSERT_TRUE(lj["chunks"].is_array()) << l.out;
  ASSERT_EQ(lj["chunks"].size(), num_chunks) << l.out;
  EXPECT_EQ(lj["left_out"], 0u);
  EXPECT_EQ(lj["namespace_id"], id);
  const int64_t elapsed_s = MsSince(started) / 1000 + 1;
  uint64_t hits = 0;
  std::set<std::string> keys;
  for (const json& ch : lj["chunks"]) {
    keys.insert(ch["key"].get<std::string>());
    EXPECT_EQ(ch["key"].get<std::string>().size(), 32u);
    EXPECT_EQ(ch["tiers"], json::array({"dram"})) << ch.dump();
    EXPECT_EQ(ch["payload_bytes"], payload) << ch.dump();
    EXPECT_EQ(ch["slot_bytes"], ns["slot_bytes"]) << ch.dump();
    ASSERT_TRUE(ch["age_s"].is_number_unsigned()) << ch.dump();
    EXPECT_LE(ch["age_s"].get<int64_t>(), elapsed_s) << ch.dump();
    EXPECT_EQ(ch["pinned"], false) << ch.dump();
    hits += ch["hits"].get<uint64_t>();
  }
  EXPECT_EQ(keys.size(), num_chunks);
  // Every DRAM hit the daemon counted is on one of the listed chunks.
  const json s = Stats(daemon);
  EXPECT_GT(hits, 0u);
  EXPECT_EQ(hits, s["tiers"][0]["hits"].get<uint64_t>()) << l.out;

  // --limit bounds the answer and says how many were left out.
  json lim = ParseJson(daemon.Ctl({"--json", "ls", "--namespace", id, "--limit", "2"}));
  EXPECT_EQ(lim["chunks"].size(), 2u) << lim.dump();
  EXPECT_EQ(lim["left_out"], num_chunks - 2) << lim.dump();
  CommandResult table = daemon.Ctl({"ls", "--namespace", id, "--limit", "2"});
  ASSERT_TRUE(table.ok()) << table.Describe();
  EXPECT_NE(table.out.find(lim["chunks"][0]["key"].get<std::string>()), std::string::npos);
  EXPECT_NE(table.out.find("dram"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find(std::to_string(num_chunks - 2) + " more chunks not listed"),
            std::string::npos)
      << table.out;

  // A prompt prefix: the two chunks every conversation of store-load begins with.
  std::vector<int32_t> prefix;
  AppendTokens(&prefix, /*stream=*/7, 0, 2 * 128);
  json arr = prefix;
  const std::string tokens_file = dir_.Sub("prefix.json");
  ASSERT_TRUE(testing::WriteFile(tokens_file, arr.dump()));
  json pj =
      ParseJson(daemon.Ctl({"--json", "ls", "--namespace", id, "--tokens-file", tokens_file}));
  ASSERT_EQ(pj["chunks"].size(), 2u) << pj.dump();
  for (const json& ch : pj["chunks"]) {
    EXPECT_TRUE(keys.contains(ch["key"].get<std::string>())) << ch.dump();
    EXPECT_GT(ch["hits"].get<uint64_t>(), 0u) << ch.dump();  // every request loaded them
  }

  // A lease shows as pinned.
  ChildProcess holder;
  json held = SpawnHolder(holder);
  ASSERT_FALSE(held.is_discarded());
  json hj = ParseJson(daemon.Ctl({"--json", "ls", "--namespace", id}));
  uint64_t pinned = 0;
  for (const json& ch : hj["chunks"]) pinned += ch["pinned"].get<bool>() ? 1 : 0;
  EXPECT_EQ(pinned, held["leased_chunks"].get<uint64_t>()) << hj.dump();
  holder.Signal(SIGKILL);
  holder.Wait(10s);
  ASSERT_TRUE(WaitFor([&] { return Stats(daemon)["active_leases"] == 0u; }, 10s));

  // Usage errors exit 2; what the daemon refuses exits 1.
  const std::string unknown(32, 'a');
  for (const std::vector<std::string>& bad :
       {std::vector<std::string>{"ls", "--namespace", "nothex"},
        {"ls", "--namespace", id, "--limit", "0"},
        {"ls", "--namespace", id, "--limit", "100001"},
        {"ls", "--namespace", id, "--tokens", "1,x"},
        {"ls", "--namespace", id, "--tokens", ""},
        {"ls", "--limit", "5"},
        {"ls", "--tokens", "1,2"}}) {
    CommandResult r = daemon.Ctl(bad);
    EXPECT_TRUE(ExitedWith(r, 2)) << r.Describe();
    EXPECT_FALSE(r.err.empty()) << r.Describe();
  }
  CommandResult none = daemon.Ctl({"ls", "--namespace", unknown});
  EXPECT_TRUE(ExitedWith(none, 1)) << none.Describe();
  EXPECT_NE(none.err.find("has no cached chunk"), std::string::npos) << none.Describe();
  CommandResult short_prompt = daemon.Ctl({"ls", "--namespace", id, "--tokens", "1,2,3"});
  EXPECT_TRUE(ExitedWith(short_prompt, 1)) << short_prompt.Describe();
  EXPECT_NE(short_prompt.err.find("less than one chunk"), std::string::npos)
      << short_prompt.Describe();

  // evict's audit line names the caller: its pid and uid from the socket's credentials.
  ASSERT_TRUE(daemon.Ctl({"evict", "--namespace", id}).ok());
  const std::string log = ReadFileOrEmpty(dir_.Sub("kvtierd.log"));
  const size_t line = log.find("admin: evict namespace " + id);
  ASSERT_NE(line, std::string::npos) << log;
  const std::string audit = log.substr(line, log.find('\n', line) - line);
  EXPECT_NE(audit.find("uid " + std::to_string(getuid())), std::string::npos) << audit;
  const uint64_t removed = num_chunks + held["stored_chunks"].get<uint64_t>();  // and the holder's
  EXPECT_NE(audit.find("dram: " + std::to_string(removed) + " removed"), std::string::npos)
      << audit;
}

TEST_F(DaemonTest, KvtierctlFlushReturnsOnceTheNvmeWritesHaveDrained) {
  // DRAM only: nothing to flush, exit 1 saying so.
  {
    DaemonProcess dram_only(Opts());
    ASSERT_EQ(dram_only.Start(), "");
    CommandResult f = dram_only.Ctl({"flush"});
    EXPECT_TRUE(ExitedWith(f, 1)) << f.Describe();
    EXPECT_NE(f.err.find("no NVMe tier"), std::string::npos) << f.Describe();
  }
  std::filesystem::create_directories(dir_.Sub("nvme"));
  DaemonProcess daemon(Opts({"--nvme-path", dir_.Sub("nvme"), "--nvme-bytes", "256MiB"}));
  ASSERT_EQ(daemon.Start(), "");
  for (const std::vector<std::string>& bad : {std::vector<std::string>{"flush", "--timeout", "0"},
                                              {"flush", "--timeout", "-1"},
                                              {"flush", "--timeout", "soon"}}) {
    CommandResult r = daemon.Ctl(bad);
    EXPECT_TRUE(ExitedWith(r, 2)) << r.Describe();
  }
  CommandResult c = StoreLoad("6", "12");
  ASSERT_TRUE(c.ok()) << c.Describe();
  CommandResult f = daemon.Ctl({"--json", "flush", "--timeout", "60"});
  ASSERT_TRUE(f.ok()) << f.Describe();
  json fj = ParseJson(f);
  EXPECT_EQ(fj["drained"], true) << f.out;
  // Write-through: once drained, every DRAM chunk is on NVMe too.
  json s = Stats(daemon);
  std::map<std::string, json> tiers;
  for (const json& t : s["tiers"]) tiers[t["name"]] = t;
  ASSERT_TRUE(tiers.count("nvme")) << s.dump();
  EXPECT_EQ(tiers["nvme"]["pending_writes"], 0u) << s.dump();
  EXPECT_EQ(tiers["nvme"]["chunks"], tiers["dram"]["chunks"]) << s.dump();
  EXPECT_GT(tiers["nvme"]["write_bytes"].get<uint64_t>(), 0u);
  // ls shows both tiers for them.
  const std::string id = OnlyNamespace(daemon)["namespace_id"];
  json lj = ParseJson(daemon.Ctl({"--json", "ls", "--namespace", id}));
  ASSERT_FALSE(lj["chunks"].empty()) << lj.dump();
  for (const json& ch : lj["chunks"]) EXPECT_EQ(ch["tiers"], json::array({"dram", "nvme"}));
  CommandResult human = daemon.Ctl({"flush"});
  EXPECT_TRUE(human.ok()) << human.Describe();
  EXPECT_NE(human.out.find("drained"), std::string::npos) << human.Describe();
}

TEST_F(DaemonTest, KvtierctlStatsWatchRatesMatchTheWorkBetweenSamples) {
  DaemonProcess daemon(Opts());
  ASSERT_EQ(daemon.Start(), "");
  for (const std::vector<std::string>& bad : {std::vector<std::string>{"stats", "--watch", "-1"},
                                              {"stats", "--watch", "0"},
                                              {"stats", "--watch", "x"},
                                              {"stats", "--count", "2"},
                                              {"stats", "--watch", "1", "--count", "0"}}) {
    CommandResult r = daemon.Ctl(bad);
    EXPECT_TRUE(ExitedWith(r, 2)) << r.Describe();
  }
  // Not a TTY: one block per sample, no escape codes.
  CommandResult blocks = daemon.Ctl({"stats", "--watch", "0.2", "--count", "2"});
  ASSERT_TRUE(blocks.ok()) << blocks.Describe();
  EXPECT_NE(blocks.out.find("sample 1,"), std::string::npos) << blocks.out;
  EXPECT_NE(blocks.out.find("sample 2,"), std::string::npos) << blocks.out;
  EXPECT_EQ(blocks.out.find("sample 3,"), std::string::npos) << blocks.out;
  EXPECT_EQ(blocks.out.find('\033'), std::string::npos) << blocks.out;
  // On a terminal (script(1) gives it one) each sample redraws the screen.
  if (access("/usr/bin/script", X_OK) == 0) {
    CommandResult tty =
        RunCommand({"/usr/bin/script", "-qec",
                    BinPath("kvtierctl") + " --socket " + socket_ + " stats --watch 0.2 --count 2",
                    "/dev/null"},
                   20s);
    ASSERT_TRUE(tty.ok()) << tty.Describe();
    size_t clears = 0;
    for (size_t at = tty.out.find("\033[H\033[2J"); at != std::string::npos;
         at = tty.out.find("\033[H\033[2J", at + 1)) {
      ++clears;
    }
    EXPECT_EQ(clears, 2u) << tty.out;
  }

  // One 15 s sample with all of the test's work inside it.
  ChildProcess watch;
  std::string err;
  ASSERT_TRUE(watch.Spawn({BinPath("kvtierctl"), "--socket", socket_, "--json", "stats", "--watch",
                           "15", "--count", "1"},
                          dir_.Sub("watch.out"), dir_.Sub("watch.err"), &err))
      << err;
  std::this_thread::sleep_for(1500ms);  // its first sample is taken
  const auto work_start = Clock::now();
  CommandResult c = StoreLoad("8", "6");
  ASSERT_TRUE(c.ok()) << c.Describe();
  if (MsSince(work_start) > 12000) GTEST_SKIP() << "the work outlasted the sample on this machine";
  auto exit = watch.Wait(30s);
  ASSERT_TRUE(exit && exit->exited && exit->exit_code == 0)
      << ReadFileOrEmpty(dir_.Sub("watch.err"));
  json r = json::parse(ReadFileOrEmpty(dir_.Sub("watch.out")), nullptr, false);
  ASSERT_FALSE(r.is_discarded()) << ReadFileOrEmpty(dir_.Sub("watch.out"));
  const json s = Stats(daemon);  // the daemon did nothing but the test's work
  const double dt = r["interval_s"];
  EXPECT_GT(dt, 14.0);
  EXPECT_LT(dt, 20.0);
  EXPECT_EQ(r["lookups"], s["lookups"]);
  EXPECT_GT(r["lookups"].get<uint64_t>(), 0u);
  EXPECT_NEAR(r["lookups_per_s"].get<double>(), s["lookups"].get<double>() / dt, 1e-6);
  EXPECT_NEAR(r["hit_tokens_per_s"].get<double>(), s["hit_tokens"].get<double>() / dt, 1e-6);
  const json& t = r["tiers"][0];
  EXPECT_EQ(t["name"], "dram");
  EXPECT_NEAR(t["hits_per_s"].get<double>(), s["tiers"][0]["hits"].get<double>() / dt, 1e-6);
  EXPECT_NEAR(t["write_gb_per_s"].get<double>(),
              s["tiers"][0]["write_bytes"].get<double>() / 1e9 / dt, 1e-12);
  EXPECT_NEAR(t["read_gb_per_s"].get<double>(),
              s["tiers"][0]["read_bytes"].get<double>() / 1e9 / dt, 1e-12);
  EXPECT_GT(t["write_bytes"].get<uint64_t>(), 0u);
}

TEST_F(DaemonTest, KvtierctlConfigShowsTheMergedOptionsAndTheirSources) {
  const std::string yaml = dir_.Sub("kvtierd.yaml");
  ASSERT_TRUE(testing::WriteFile(yaml, "reservation_ttl_ms: 7777\nlease_ttl_ms: 1000\n"));
  DaemonProcess daemon(
      Opts({"--config", yaml, "--lease-ttl-ms", "12345", "--dram-eviction", "s3fifo"}));
  ASSERT_EQ(daemon.Start(), "");
  CommandResult r = daemon.Ctl({"--json", "config"});
  ASSERT_TRUE(r.ok()) << r.Describe();
  json j = ParseJson(r);
  ASSERT_TRUE(j["config"].is_object()) << r.out;
  EXPECT_EQ(j["config"]["lease_ttl_ms"], "12345");  // the flag wins over the file
  EXPECT_EQ(j["sources"]["lease_ttl_ms"], "flag");
  EXPECT_EQ(j["config"]["reservation_ttl_ms"], "7777");
  EXPECT_NE(j["sources"]["reservation_ttl_ms"].get<std::string>().find(yaml + ":1"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(j["config"]["dram_bytes"], std::to_string(64u << 20));
  EXPECT_EQ(j["config"]["socket"], socket_);
  EXPECT_EQ(j["config"]["nvme_bytes"], "0");
  EXPECT_EQ(j["config"]["selective_min_hits"], "2");
  EXPECT_EQ(j["config"]["dram_eviction"], "s3fifo");
  EXPECT_EQ(j["config"]["nvme_eviction"], "lru");
  EXPECT_EQ(j["sources"]["selective_min_hits"], "default");
  EXPECT_EQ(j["config"]["session_max_bytes"], std::to_string(32u << 20));  // half of DRAM
  CommandResult human = daemon.Ctl({"config"});
  ASSERT_TRUE(human.ok()) << human.Describe();
  EXPECT_NE(human.out.find("lease_ttl_ms: 12345  # flag"), std::string::npos) << human.out;
}

TEST_F(DaemonTest, KvtierctlBashCompletionCompletesCommandsAndOptions) {
  const std::string script = dir_.Sub("kvtierctl.bash");
  CommandResult gen = RunCommand({BinPath("kvtierctl"), "completion", "bash"}, 20s);
  ASSERT_TRUE(gen.ok()) << gen.Describe();
  ASSERT_TRUE(testing::WriteFile(script, gen.out));
  auto complete = [&](const std::string& words, int cword) {
    return RunCommand({"/bin/bash", "-c",
                       "source '" + script + "' && complete -p kvtierctl && COMP_WORDS=(" + words +
                           ") && COMP_CWORD=" + std::to_string(cword) +
                           " && _kvtierctl && printf 'reply:%s\\n' \"${COMPREPLY[@]}\""},
                      20s);
  };
  CommandResult l = complete("kvtierctl l", 1);
  ASSERT_TRUE(l.ok()) << l.Describe();
  EXPECT_NE(l.out.find("complete -F _kvtierctl kvtierctl"), std::string::npos) << l.out;
  EXPECT_NE(l.out.find("reply:ls\n"), std::string::npos) << l.out;
  EXPECT_EQ(l.out.find("reply:stats\n"), std::string::npos) << l.out;
  CommandResult w = complete("kvtierctl stats --w", 2);
  ASSERT_TRUE(w.ok()) << w.Describe();
  EXPECT_NE(w.out.find("reply:--watch\n"), std::string::npos) << w.out;
  CommandResult n = complete("kvtierctl ls --n", 2);
  EXPECT_NE(n.out.find("reply:--namespace\n"), std::string::npos) << n.out;
  CommandResult bad = RunCommand({BinPath("kvtierctl"), "completion", "fish"}, 20s);
  EXPECT_TRUE(ExitedWith(bad, 2)) << bad.Describe();
}

TEST_F(DaemonTest, KvtierctlZshCompletionIsValidZsh) {
  const char* zsh = nullptr;
  for (const char* p : {"/usr/bin/zsh", "/bin/zsh"}) {
    if (access(p, X_OK) == 0) zsh = p;
  }
  if (zsh == nullptr) GTEST_SKIP() << "zsh is not installed: its completion script is not checked";
  const std::string script = dir_.Sub("_kvtierctl");
  CommandResult gen = RunCommand({BinPath("kvtierctl"), "completion", "zsh"}, 20s);
  ASSERT_TRUE(gen.ok()) << gen.Describe();
  ASSERT_TRUE(testing::WriteFile(script, gen.out));
  CommandResult check = RunCommand({zsh, "-n", script}, 20s);
  EXPECT_TRUE(check.ok()) << check.Describe();
  // Sourced after compinit, it registers itself for kvtierctl.
  CommandResult reg = RunCommand({zsh, "-c",
                                  "autoload -U compinit && compinit -u -D && source '" + script +
                                      "' && print -r -- \"comp=$_comps[kvtierctl]\""},
                                 20s);
  EXPECT_NE(reg.out.find("comp=_kvtierctl"), std::string::npos) << reg.Describe();
}

}  // namespace
}  // namespace kvtier
