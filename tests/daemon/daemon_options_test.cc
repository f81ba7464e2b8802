// ParseDaemonOptions: defaults, flags, the YAML config file, and its errors.
#include "kvtier/daemon/daemon_options.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/status_printer.h"
#include "kvtier/units.h"

namespace kvtier {
namespace {

using std::chrono::milliseconds;

class DaemonOptionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvtier-options-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string WriteConfig(const std::string& text) {
    const std::string path = dir_ + "/kvtierd.yaml";
    std::ofstream(path) << text;
    return path;
  }

  Result<DaemonOptions> Parse(std::vector<std::string> args) {
    args.insert(args.begin(), "kvtierd");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    // No exception may cross a module boundary (STYLE.md): report one as a failure.
    try {
      return ParseDaemonOptions(static_cast<int>(args.size()), argv.data(), &exit_code_);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "ParseDaemonOptions threw: " << e.what();
      return Status::Internal(std::string("exception: ") + e.what());
    }
  }

  // The error of a parse that must fail with INVALID_ARGUMENT.
  std::string ErrorOf(std::vector<std::string> args) {
    auto r = Parse(std::move(args));
    EXPECT_FALSE(r.ok());
    if (r.ok()) return "";
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
    return r.status().message();
  }

  std::string dir_;
  int exit_code_ = 0;
};

::testing::AssertionResult Names(const std::string& message, const std::string& text) {
  if (message.find(text) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << message << "' does not name '" << text << "'";
}

TEST_F(DaemonOptionsTest, NoArgumentsGiveTheEmbeddedDefaults) {
  auto r = Parse({});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(exit_code_, -1);
  EXPECT_EQ(r->core.dram_bytes, kGiB);
  EXPECT_EQ(r->core.lease_ttl, milliseconds(30000));
  EXPECT_EQ(r->core.reservation_ttl, milliseconds(30000));
  EXPECT_EQ(r->log_level, "info");
  EXPECT_EQ(r->socket_group, "");
  EXPECT_EQ(r->socket_path, DefaultSocketPath());
  EXPECT_TRUE(r->Validate().ok());
}

TEST_F(DaemonOptionsTest, DefaultSocketPathFollowsXdgRuntimeDir) {
  const char* old = getenv("XDG_RUNTIME_DIR");
  const std::string saved = old ? old : "";
  setenv("XDG_RUNTIME_DIR", "/run/user/4242", 1);
  EXPECT_EQ(DefaultSocketPath(), "/run/user/4242/kvtier/kvtierd.sock");
  setenv("XDG_RUNTIME_DIR", "", 1);
  EXPECT_EQ(DefaultSocketPath(), "/tmp/kvtier/kvtierd.sock");
  unsetenv("XDG_RUNTIME_DIR");
  EXPECT_EQ(DefaultSocketPath(), "/tmp/kvtier/kvtierd.sock");
  if (old) setenv("XDG_RUNTIME_DIR", saved.c_str(), 1);
}

TEST_F(DaemonOptionsTest, FlagsSetEachOption) {
  auto r =
      Parse({"--dram-bytes", "512MiB", "--socket", dir_ + "/d.sock", "--socket-group", "kvusers",
             "--log-level", "debug", "--lease-ttl-ms", "1500", "--reservation-ttl-ms=2500"});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->core.dram_bytes, 512 * kMiB);
  EXPECT_EQ(r->socket_path, dir_ + "/d.sock");
  EXPECT_EQ(r->socket_group, "kvusers");
  EXPECT_EQ(r->log_level, "debug");
  EXPECT_EQ(r->core.lease_ttl, milliseconds(1500));
  EXPECT_EQ(r->core.reservation_ttl, milliseconds(2500));
}

TEST_F(DaemonOptionsTest, DramBytesAcceptsPlainBytes) {
  auto r = Parse({"--dram-bytes=1073741824"});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->core.dram_bytes, kGiB);
}

TEST_F(DaemonOptionsTest, BadDramBytesNamesTheFlag) {
  EXPECT_TRUE(Names(ErrorOf({"--dram-bytes", "12XB"}), "--dram-bytes"));
  EXPECT_TRUE(Names(ErrorOf({"--dram-bytes", ""}), "--dram-bytes"));
  EXPECT_TRUE(Names(ErrorOf({"--dram-bytes", "99999999999999999999"}), "--dram-bytes"));
}

TEST_F(DaemonOptionsTest, DramBytesNotAPageMultipleIsRejected) {
  EXPECT_TRUE(Names(ErrorOf({"--dram-bytes", "5000"}), "dram"));
}

TEST_F(DaemonOptionsTest, TtlsOutsideTheirRangeAreNamed) {
  EXPECT_TRUE(Names(ErrorOf({"--lease-ttl-ms", "0"}), "--lease-ttl-ms"));
  EXPECT_TRUE(Names(ErrorOf({"--lease-ttl-ms", "99"}), "--lease-ttl-ms"));
  EXPECT_TRUE(Names(ErrorOf({"--reservation-ttl-ms", "-5"}), "--reservation-ttl-ms"));
  // Past a day: no backstop any more, and large values overflowed the clock.
  EXPECT_TRUE(Names(ErrorOf({"--lease-ttl-ms", "86400001"}), "--lease-ttl-ms"));
  EXPECT_TRUE(Names(ErrorOf({"--lease-ttl-ms", "10000000000000"}), "--lease-ttl-ms"));
  EXPECT_TRUE(Names(ErrorOf({"--lease-ttl-ms", "soon"}), "lease-ttl-ms"));
  EXPECT_TRUE(Parse({"--lease-ttl-ms", "100", "--reservation-ttl-ms", "86400000"}).ok());
}

TEST_F(DaemonOptionsTest, DrainTimeoutDefaultsToTenSecondsAndIsBounded) {
  auto d = Parse({});
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->drain_timeout, milliseconds(10000));
  auto r = Parse({"--drain-timeout-ms", "0"});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->drain_timeout, milliseconds(0));
  EXPECT_TRUE(Names(ErrorOf({"--drain-timeout-ms", "-1"}), "--drain-timeout-ms -1"));
  EXPECT_TRUE(Names(ErrorOf({"--drain-timeout-ms", "3600001"}), "--drain-timeout-ms"));
  auto y = Parse({"--config", WriteConfig("drain_timeout_ms: 2500\n")});
  ASSERT_TRUE(y.ok()) << y.status().ToString();
  EXPECT_EQ(y->drain_timeout, milliseconds(2500));
}

TEST_F(DaemonOptionsTest, SessionMaxBytesDefaultsToHalfTheArenaAndParsesSizes) {
  auto d = Parse({"--dram-bytes", "64MiB"});
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->core.session_max_bytes, 0u);
  EXPECT_EQ(d->core.SessionMaxBytes(), uint64_t{32} << 20);
  auto f = Parse({"--dram-bytes", "64MiB", "--session-max-bytes", "48MiB"});
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->core.SessionMaxBytes(), uint64_t{48} << 20);
  auto y = Parse({"--config", WriteConfig("session_max_bytes: 1GiB\n")});
  ASSERT_TRUE(y.ok()) << y.status().ToString();
  EXPECT_EQ(y->core.session_max_bytes, uint64_t{1} << 30);
  EXPECT_TRUE(Names(ErrorOf({"--session-max-bytes", "lots"}), "--session-max-bytes"));
}

// Issue 10, item 13: duplicate YAML keys used to be accepted silently (the last won).
TEST_F(DaemonOptionsTest, ADuplicateYamlKeyIsAnErrorNamingIt) {
  const std::string cfg = WriteConfig("dram_bytes: 64MiB\nlog_level: info\ndram_bytes: 1GiB\n");
  const std::string error = ErrorOf({"--config", cfg});
  EXPECT_TRUE(Names(error, "dram_bytes")) << error;
  EXPECT_TRUE(Names(error, "twice")) << error;
}

TEST_F(DaemonOptionsTest, AConfigOfSeveralYamlDocumentsIsRefused) {
  const std::string cfg = WriteConfig("dram_bytes: 16MiB\n---\ndram_bytes: 32MiB\nbogus_key: 1\n");
  EXPECT_TRUE(Names(ErrorOf({"--config", cfg}), "2 YAML documents"));
}

// Found by fuzz_config: yaml-cpp 0.7's LoadAll never returns on a stray ',' (each call yields
// another empty document without reading on; jbeder/yaml-cpp#1040), so kvtierd grew its
// memory until the kernel killed it. Such a config is refused, naming it.
TEST_F(DaemonOptionsTest, AConfigYamlCppCannotReadToItsEndIsRefused) {
  for (const char* text : {",", "&&,", "dram_bytes: 64MiB\n...\n,\n"}) {
    const std::string cfg = WriteConfig(text);
    const std::string error = ErrorOf({"--config", cfg});
    EXPECT_TRUE(Names(error, "config " + cfg + ":")) << text << ": " << error;
  }
}

// Found by fuzz_config: a key that is not a plain name (a list, a map, a null) made
// yaml-cpp throw outside the error handling, and kvtierd died in std::terminate.
TEST_F(DaemonOptionsTest, AKeyThatIsNotANameIsAnErrorNotACrash) {
  for (const char* text :
       {"? [dram_bytes]\n: 64MiB\n", "{[1]: 2}\n", "{{a: 1}: 2}\n", "? \n: 1\n"}) {
    const std::string cfg = WriteConfig(text);
    const std::string error = ErrorOf({"--config", cfg});
    EXPECT_TRUE(Names(error, "config " + cfg + ":")) << text << ": " << error;
    EXPECT_TRUE(Names(error, "not a name")) << text << ": " << error;
  }
}

TEST_F(DaemonOptionsTest, UnknownFlagIsNamed) {
  EXPECT_TRUE(Names(ErrorOf({"--dram-size", "1GiB"}), "--dram-size"));
}

TEST_F(DaemonOptionsTest, OverlongSocketPathIsRejected) {
  EXPECT_TRUE(Names(ErrorOf({"--socket", "/tmp/" + std::string(100, 's') + ".sock"}), "socket"));
}

TEST_F(DaemonOptionsTest, HelpAndVersionSetTheExitCode) {
  testing::internal::CaptureStdout();
  EXPECT_FALSE(Parse({"--help"}).ok());
  EXPECT_EQ(exit_code_, 0);
  exit_code_ = 7;
  EXPECT_FALSE(Parse({"--version"}).ok());
  EXPECT_EQ(exit_code_, 0);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_TRUE(Names(out, "--dram-bytes"));
}

TEST_F(DaemonOptionsTest, ConfigFileValuesApply) {
  const std::string cfg = WriteConfig("socket: " + dir_ + "/cfg.sock\n" +
                                      "socket_group: engines\n"
                                      "log_level: warn\n"
                                      "dram_bytes: 64MiB\n"
                                      "lease_ttl_ms: 5000\n"
                                      "reservation_ttl_ms: 7000\n");
  auto r = Parse({"--config", cfg});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->socket_path, dir_ + "/cfg.sock");
  EXPECT_EQ(r->socket_group, "engines");
  EXPECT_EQ(r->log_level, "warn");
  EXPECT_EQ(r->core.dram_bytes, 64 * kMiB);
  EXPECT_EQ(r->core.lease_ttl, milliseconds(5000));
  EXPECT_EQ(r->core.reservation_ttl, milliseconds(7000));
}

TEST_F(DaemonOptionsTest, FlagsWinOverTheConfigFile) {
  const std::string cfg = WriteConfig("dram_bytes: 64MiB\nlease_ttl_ms: 5000\nlog_level: warn\n");
  auto r = Parse({"--dram-bytes", "128MiB", "--config", cfg, "--lease-ttl-ms", "30000"});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->core.dram_bytes, 128 * kMiB);
  // A flag wins even when it repeats the default value.
  EXPECT_EQ(r->core.lease_ttl, milliseconds(30000));
  EXPECT_EQ(r->log_level, "warn");  // not given as a flag: the file's value
}

TEST_F(DaemonOptionsTest, EmptyConfigFileKeepsDefaults) {
  auto r = Parse({"--config", WriteConfig("")});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->core.dram_bytes, kGiB);
}

TEST_F(DaemonOptionsTest, UnknownConfigKeyIsNamed) {
  const std::string cfg = WriteConfig("dram_bytes: 64MiB\ndram_size: 1GiB\n");
  EXPECT_TRUE(Names(ErrorOf({"--config", cfg}), "dram_size"));
}

TEST_F(DaemonOptionsTest, MalformedYamlIsAnErrorNamingTheFile) {
  const std::string cfg = WriteConfig("dram_bytes: [64MiB\nlease_ttl_ms: {\n");
  EXPECT_TRUE(Names(ErrorOf({"--config", cfg}), cfg));
}

TEST_F(DaemonOptionsTest, ConfigTopLevelMustBeAMap) {
  EXPECT_TRUE(Names(ErrorOf({"--config", WriteConfig("- dram_bytes\n- 64MiB\n")}), "map"));
}

TEST_F(DaemonOptionsTest, ConfigValueOfTheWrongTypeNamesTheKey) {
  EXPECT_TRUE(Names(ErrorOf({"--config", WriteConfig("lease_ttl_ms: soon\n")}), "lease_ttl_ms"));
  EXPECT_TRUE(Names(ErrorOf({"--config", WriteConfig("dram_bytes: [1, 2]\n")}), "dram_bytes"));
  // A list or a map is not a missing value: the error says which it got, and where.
  // Every config error with a line says it as FILE:LINE (as the checks of values do).
  std::string cfg = WriteConfig("dram_bytes: [1, 2]\n");
  EXPECT_TRUE(Names(ErrorOf({"--config", cfg}),
                    "config " + cfg + ":1: key 'dram_bytes' takes one value, not a list"));
  cfg = WriteConfig("log_level: info\nsocket: {a: 1}\n");
  EXPECT_TRUE(Names(ErrorOf({"--config", cfg}),
                    "config " + cfg + ":2: key 'socket' takes one value, not a map"));
  cfg = WriteConfig("dram_bytes:\n");
  EXPECT_TRUE(
      Names(ErrorOf({"--config", cfg}), "config " + cfg + ":1: key 'dram_bytes' needs a value"));
  cfg = WriteConfig("log_level: info\nlease_ttl_ms: soon\n");
  EXPECT_TRUE(
      Names(ErrorOf({"--config", cfg}), "config " + cfg + ":2: key 'lease_ttl_ms' must be"));
  cfg = WriteConfig("log_level: info\nlog_level: warn\n");
  EXPECT_TRUE(
      Names(ErrorOf({"--config", cfg}), "config " + cfg + ":2: key 'log_level' appears twice"));
  cfg = WriteConfig("log_level: info\ndram_size: 1GiB\n");
  EXPECT_TRUE(Names(ErrorOf({"--config", cfg}), "config " + cfg + ":2: unknown key 'dram_size'"));
  cfg = WriteConfig("log_level: info\ndram_bytes: [64MiB\n");
  EXPECT_TRUE(Names(ErrorOf({"--config", cfg}), "config " + cfg + ":"));
  EXPECT_FALSE(Names(ErrorOf({"--config", cfg}), "yaml-cpp: error at line"));
}

TEST_F(DaemonOptionsTest, BadDramBytesInConfigIsRejected) {
  EXPECT_TRUE(Names(ErrorOf({"--config", WriteConfig("dram_bytes: 12XB\n")}), "12XB"));
}

// An arena larger than RAM is refused where it was given: the config file and key, or the
// flag (Daemon::Start's own check named neither).
TEST_F(DaemonOptionsTest, ADramArenaLargerThanMemoryNamesWhereItWasGiven) {
  const std::string cfg = WriteConfig("dram_bytes: 99999TiB\n");
  const std::string from_file = ErrorOf({"--config", cfg});
  EXPECT_TRUE(Names(from_file, "config " + cfg +
                                   ":1: dram_bytes 109950063265972224 exceeds this "
                                   "machine's memory"));
  EXPECT_TRUE(Names(ErrorOf({"--dram-bytes", "99999TiB"}),
                    "--dram-bytes 109950063265972224 "
                    "exceeds this machine's memory"));
  EXPECT_TRUE(Parse({"--dram-bytes", "64MiB"}).ok());
}

// An empty NVMe path would be kvtierd's working directory; a null one read as a directory
// named "null".
TEST_F(DaemonOptionsTest, AnEmptyOrNullNvmePathIsAnError) {
  EXPECT_TRUE(Names(ErrorOf({"--nvme-path", "", "--nvme-bytes", "1GiB"}),
                    "--nvme-path gives an empty path"));
  const std::string empty = WriteConfig("nvme_bytes: 1GiB\nnvme_paths: [\"\"]\n");
  EXPECT_TRUE(Names(ErrorOf({"--config", empty}), "config " + empty +
                                                      ":2: nvme_paths gives an "
                                                      "empty path"));
  std::string cfg = WriteConfig("nvme_paths:\n");
  EXPECT_TRUE(Names(ErrorOf({"--config", cfg}), cfg + ":1: key 'nvme_paths' needs a value"));
  cfg = WriteConfig("log_level: info\nnvme_paths: [~]\n");
  EXPECT_TRUE(Names(ErrorOf({"--config", cfg}),
                    cfg + ":2: key 'nvme_paths' must be a directory or a list of directories"));
}

TEST_F(DaemonOptionsTest, MissingConfigFileIsAnError) {
  EXPECT_TRUE(Names(ErrorOf({"--config", dir_ + "/absent.yaml"}), "absent.yaml"));
}

}  // namespace
}  // namespace kvtier

namespace kvtier {
namespace {

TEST_F(DaemonOptionsTest, NvmeFlagsAreCheckedAndNamed) {
  auto ok = Parse({"--nvme-path", "/tmp", "--nvme-bytes", "64MiB", "--nvme-write-policy",
                   "selective", "--selective-min-hits", "3"});
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->core.nvme.paths, std::vector<std::string>{"/tmp"});
  EXPECT_EQ(ok->core.nvme.bytes_per_path, uint64_t{64} << 20);
  EXPECT_EQ(ok->core.nvme_write_policy, NvmeWritePolicy::kSelective);
  EXPECT_EQ(ok->core.selective_min_hits, 3u);
  EXPECT_FALSE(ok->nvme_default_path);
  const DaemonOptions defaults = Parse({}).value();
  EXPECT_EQ(defaults.core.nvme.paths, std::vector<std::string>{"kvtier-data"})
      << "NVMe is on by default, under ./kvtier-data";
  EXPECT_EQ(defaults.core.nvme.bytes_per_path, uint64_t{8} << 30);
  EXPECT_TRUE(defaults.nvme_default_path);
  EXPECT_EQ(defaults.core.nvme_workers, 2u);
  EXPECT_EQ(defaults.core.nvme.queue_depth, 32u);
  EXPECT_TRUE(Parse({"--nvme-bytes", "0"}).value().core.nvme.paths.empty()) << "0 turns it off";
  EXPECT_EQ(Parse({"--nvme-workers", "4"}).value().core.nvme_workers, 4u);
  EXPECT_TRUE(Names(ErrorOf({"--nvme-workers", "0"}), "--nvme-workers 0"));
  EXPECT_TRUE(
      Names(ErrorOf({"--nvme-path", "/tmp", "--nvme-bytes", "0"}), "--nvme-path gives paths"));
  EXPECT_TRUE(Names(ErrorOf({"--nvme-bytes", "0", "--rebuild-index"}), "--rebuild-index"));
  EXPECT_TRUE(Names(ErrorOf({"--nvme-bytes", "0", "--nvme-write-policy", "writeback"}),
                    "--nvme-write-policy 'writeback'"))
      << "checked even with the tier off";
  const std::string cfg = WriteConfig("nvme_paths: [/tmp]\nnvme_bytes: 64MiB\n");
  auto flag_wins = Parse({"--config", cfg, "--nvme-bytes", "0"});
  ASSERT_TRUE(flag_wins.ok()) << flag_wins.status().ToString();
  EXPECT_TRUE(flag_wins->core.nvme.paths.empty()) << "--nvme-bytes 0 wins over the file";
  // ... and says so (a fresh user found the file's paths dropped without a word).
  ASSERT_EQ(flag_wins->ignored.size(), 1u);
  EXPECT_TRUE(Names(flag_wins->ignored[0], "config " + cfg +
                                               ":1: nvme_paths has no effect: "
                                               "--nvme-bytes 0 turns the NVMe tier off"));
  EXPECT_TRUE(Names(ErrorOf({"--config", WriteConfig("nvme_paths: []\n")}), "nvme_paths"));
  EXPECT_EQ(Parse({"--nvme-write-policy", "write_back"}).value().core.nvme_write_policy,
            NvmeWritePolicy::kWriteBack);
  EXPECT_TRUE(Names(ErrorOf({"--nvme-path", "/tmp", "--nvme-write-policy", "sometimes"}),
                    "--nvme-write-policy"));
  EXPECT_TRUE(Names(ErrorOf({"--nvme-path", "/tmp", "--nvme-bytes", "5000"}), "--nvme-bytes 5000"));
  EXPECT_TRUE(
      Names(ErrorOf({"--nvme-path", "/tmp", "--selective-min-hits", "0"}), "--selective-min-hits"));
}

// An NVMe setting given while nvme_bytes 0 turns the tier off changes nothing: kvtierd says
// so at start (it used to take it silently).
TEST_F(DaemonOptionsTest, NvmeSettingsGivenWithTheTierOffAreNamedAsIgnored) {
  auto r = Parse({"--nvme-bytes", "0", "--nvme-write-policy", "write_back"});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->ignored.size(), 1u);
  EXPECT_TRUE(Names(r->ignored[0], "--nvme-write-policy has no effect: --nvme-bytes 0"));
  const std::string cfg =
      WriteConfig("nvme_bytes: 0\nselective_min_hits: 3\nnvme_queue_depth: 8\n");
  auto c = Parse({"--config", cfg});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(c->ignored.size(), 2u);
  EXPECT_TRUE(Names(c->ignored[0], "config " + cfg + ":2: selective_min_hits has no effect"));
  EXPECT_TRUE(Names(c->ignored[1], "nvme_queue_depth"));
  EXPECT_TRUE(Names(c->ignored[0], "has no effect: nvme_bytes 0 turns the NVMe tier off"))
      << "the file is named once: " << c->ignored[0];
  auto workers = Parse({"--nvme-bytes", "0", "--nvme-workers", "8"});
  ASSERT_TRUE(workers.ok()) << workers.status().ToString();
  ASSERT_EQ(workers->ignored.size(), 1u);
  EXPECT_TRUE(Names(workers->ignored[0],
                    "--nvme-workers has no effect: --nvme-bytes 0 and "
                    "hbm_bytes 0"));
  auto hbm = Parse({"--nvme-bytes", "0", "--nvme-workers", "8", "--hbm-bytes", "1GiB"});
  ASSERT_TRUE(hbm.ok()) << hbm.status().ToString();
  EXPECT_TRUE(hbm->ignored.empty()) << "the workers copy into HBM";
  auto quiet = Parse({"--nvme-bytes", "0"});
  ASSERT_TRUE(quiet.ok());
  EXPECT_TRUE(quiet->ignored.empty());
  auto on = Parse({"--nvme-write-policy", "write_back"});
  ASSERT_TRUE(on.ok());
  EXPECT_TRUE(on->ignored.empty()) << "the tier is on: the policy applies";
}

TEST_F(DaemonOptionsTest, HbmIsOffByDefaultAndTakesItsFlagsAndKeys) {
  auto d = Parse({});
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->core.hbm.bytes, 0u);
  EXPECT_EQ(d->core.hbm.device, 0);
  EXPECT_EQ(d->core.hbm.backend, HbmBackend::kCuda);

  auto f = Parse({"--hbm-bytes", "2GiB", "--gpu", "3", "--gpu-backend", "host"});
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->core.hbm.bytes, uint64_t{2} << 30);
  EXPECT_EQ(f->core.hbm.device, 3);
  EXPECT_EQ(f->core.hbm.backend, HbmBackend::kHost);

  const std::string cfg = WriteConfig("hbm_bytes: 1GiB\ngpu: 1\ngpu_backend: host\n");
  auto c = Parse({"--config", cfg, "--gpu", "2"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->core.hbm.bytes, uint64_t{1} << 30);
  EXPECT_EQ(c->core.hbm.device, 2) << "the flag wins over the file";
  EXPECT_EQ(c->core.hbm.backend, HbmBackend::kHost);
}

// A fresh user found a bad value in the config file taken silently when a flag
// overrode it: the file is wrong all the same (and wrong the day the flag goes).
// Its form is checked (type, size, names); limits that depend on the machine
// (dram_bytes past its memory) only for the value in use.
TEST_F(DaemonOptionsTest, ABadValueInTheConfigFileIsAnErrorEvenWhenAFlagOverridesIt) {
  struct Case {
    std::string yaml, flag, value, names;
  };
  const std::vector<Case> cases = {
      {"dram_bytes: 4 gigs\n", "--dram-bytes", "64MiB", ":1: dram_bytes"},
      {"log_level: info\nnvme_bytes: lots\n", "--nvme-bytes", "0", ":2: nvme_bytes"},
      {"session_max_bytes: -1\n", "--session-max-bytes", "0", ":1: session_max_bytes"},
      {"hbm_bytes: [1]\n", "--hbm-bytes", "0", "key 'hbm_bytes' takes one value"},
      {"nvme_workers: two\n", "--nvme-workers", "2", "key 'nvme_workers' must be an integer"},
      {"nvme_write_policy: writeback\n", "--nvme-write-policy", "write_back",
       ":1: nvme_write_policy 'writeback'"},
      {"gpu_backend: cpu\n", "--gpu-backend", "host", ":1: gpu_backend"},
      {"log_level: loud\n", "--log-level", "info", ":1: log_level"},
      {"nvme_paths: {a: b}\n", "--nvme-path", "/tmp", "key 'nvme_paths' must be a directory"},
      {"remote: http://x\n", "--remote", "redis://127.0.0.1:6379", ":1: remote: "},
      {"remote: \"redis://h:1,\"\n", "--remote", "redis://127.0.0.1:6379", ":1: remote: host 2"},
      {"remote: \"\"\n", "--remote", "redis://127.0.0.1:6379", ":1: remote is empty"},
      {"remote_pool_size: 0\n", "--remote-pool-size", "4", ":1: remote_pool_size 0 is outside"},
      {"remote_timeout_ms: 0\n", "--remote-timeout-ms", "200", ":1: remote_timeout_ms 0"},
      // Every integer's range is its form (issue 34's option table): before it, only the
      // remote tier's were checked under a flag.
      {"nvme_queue_depth: 0\n", "--nvme-queue-depth", "32", ":1: nvme_queue_depth 0 is outside"},
      {"gpu: -1\n", "--gpu", "0", ":1: gpu -1 is outside 0..1023"},
      {"lease_ttl_ms: 5\n", "--lease-ttl-ms", "2500", ":1: lease_ttl_ms 5 is outside 100.."},
      {"drain_timeout_ms: -5\n", "--drain-timeout-ms", "100", ":1: drain_timeout_ms -5 is outside"},
      {"events_address: tcp://localhost:1\n", "--events-address", "ipc:///tmp/e",
       ":1: events_address 'tcp://localhost:1'"},
  };
  for (const Case& c : cases) {
    const std::string cfg = WriteConfig(c.yaml);
    const std::string error = ErrorOf({"--config", cfg, c.flag, c.value});
    EXPECT_TRUE(Names(error, c.names)) << c.yaml << " -> " << error;
    EXPECT_TRUE(Names(error, cfg)) << c.yaml << " -> " << error;
  }
  // A value that is well formed but too big for this machine is the flag's business;
  // a bad flag is named before a bad value it overrides.
  const std::string big = WriteConfig("dram_bytes: 1024TiB\n");
  auto r = Parse({"--config", big, "--dram-bytes", "64MiB", "--nvme-bytes", "0"});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->core.dram_bytes, uint64_t{64} << 20);
  const std::string both = WriteConfig("dram_bytes: 4 gigs\n");
  EXPECT_TRUE(Names(ErrorOf({"--config", both, "--dram-bytes", "4 megs"}), "--dram-bytes"));
}

// Issue 32, item 7: the remote tier's MAC key comes from a file of 32 bytes
// (raw, or 64 hex digits), which only its owner may read; anything else is
// refused naming the file and what is wrong with it.
TEST_F(DaemonOptionsTest, TheRemoteKeyFileIsReadAndABadOneIsRefusedNamingIt) {
  const auto key_file = [&](const std::string& name, const std::string& bytes, mode_t mode) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << bytes;
    EXPECT_EQ(chmod(path.c_str(), mode), 0);
    return path;
  };
  const std::string raw(32, '\x5a');
  const std::vector<std::string> base = {
      "--remote", "redis://127.0.0.1:6379", "--nvme-bytes", "64MiB", "--nvme-path", dir_};
  auto with = [&](const std::string& path) {
    std::vector<std::string> args = base;
    args.insert(args.end(), {"--remote-key-file", path});
    return args;
  };
  auto r = Parse(with(key_file("raw.key", raw, 0600)));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->core.remote.mac_key, raw);
  EXPECT_EQ(r->remote_key_file, dir_ + "/raw.key");
  r = Parse(with(key_file("hex.key", std::string(64, 'A').replace(0, 2, "5a") + "\n", 0400)));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->core.remote.mac_key, "\x5a" + std::string(31, '\xaa'));
  r = Parse(base);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->core.remote.mac_key.empty());

  std::string e = ErrorOf(with(key_file("open.key", raw, 0644)));
  EXPECT_TRUE(Names(e, "--remote-key-file")) << e;
  EXPECT_TRUE(Names(e, "open.key holds a secret but has mode 0644")) << e;
  e = ErrorOf(with(key_file("short.key", "secret\n", 0600)));
  EXPECT_TRUE(Names(e, "short.key holds 7 bytes: the key must be 32 bytes")) << e;
  e = ErrorOf(with(key_file("nothex.key", std::string(64, 'g'), 0600)));
  EXPECT_TRUE(Names(e, "holds 64 bytes")) << e;
  e = ErrorOf(with(dir_ + "/missing.key"));
  EXPECT_TRUE(Names(e, "missing.key cannot be read")) << e;
  e = ErrorOf(with(dir_));
  EXPECT_TRUE(Names(e, "is not a regular file")) << e;
  // From the config file: named by its line.
  const std::string cfg = WriteConfig("remote_key_file: " + dir_ + "/open.key\n");
  std::vector<std::string> args = base;
  args.insert(args.end(), {"--config", cfg});
  e = ErrorOf(args);
  EXPECT_TRUE(Names(e, cfg + ":1: remote_key_file")) << e;
  // Without a remote tier it has no effect, and says so.
  r = Parse({"--remote-key-file", dir_ + "/raw.key"});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->ignored.size(), 1u);
  EXPECT_TRUE(Names(r->ignored[0], "--remote-key-file has no effect")) << r->ignored[0];
}

TEST_F(DaemonOptionsTest, MetricsAddressDefaultsToLoopback9400AndIsChecked) {
  auto d = Parse({});
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->metrics_address, "127.0.0.1:9400");
  EXPECT_TRUE(d->metrics_default);
  auto off = Parse({"--metrics-address", "off"});
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(off->metrics_address, "off");
  EXPECT_FALSE(off->metrics_default);
  for (const char* good : {"0.0.0.0:9400", "[::1]:9400", "localhost:0", "10.1.2.3:65535"}) {
    auto r = Parse({"--metrics-address", good});
    EXPECT_TRUE(r.ok()) << good << ": " << r.status().ToString();
  }
  for (const char* bad : {"9400", "localhost", ":9400", "127.0.0.1:", "127.0.0.1:65536",
                          "127.0.0.1:94x0", "::1:9400", "[::1:9400", "127.0.0.1:-1", "Off"}) {
    EXPECT_TRUE(Names(ErrorOf({"--metrics-address", bad}), "--metrics-address '")) << bad;
  }
  const std::string cfg = WriteConfig("log_level: info\nmetrics_address: nowhere\n");
  EXPECT_TRUE(Names(ErrorOf({"--config", cfg}), "config " + cfg + ":2: metrics_address 'nowhere'"));
  auto from_file = Parse({"--config", WriteConfig("metrics_address: 127.0.0.1:9500\n")});
  ASSERT_TRUE(from_file.ok()) << from_file.status().ToString();
  EXPECT_EQ(from_file->metrics_address, "127.0.0.1:9500");
  EXPECT_FALSE(from_file->metrics_default) << "given in the file: a taken port refuses the start";
}

TEST_F(DaemonOptionsTest, EachTierTakesItsEvictionPolicyByFlagOrConfig) {
  auto d = Parse({});
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->core.dram_eviction, EvictionPolicyKind::kLru);
  EXPECT_EQ(d->core.nvme.eviction, EvictionPolicyKind::kLru);
  auto flags = Parse({"--dram-eviction", "s3fifo", "--nvme-eviction", "s3fifo"});
  ASSERT_TRUE(flags.ok()) << flags.status().ToString();
  EXPECT_EQ(flags->core.dram_eviction, EvictionPolicyKind::kS3Fifo);
  EXPECT_EQ(flags->core.nvme.eviction, EvictionPolicyKind::kS3Fifo);
  EXPECT_EQ(flags->core.hbm.eviction, EvictionPolicyKind::kLru);
  const std::string cfg = WriteConfig("dram_bytes: 64MiB\nhbm_eviction: s3fifo\n");
  auto file = Parse({"--config", cfg, "--hbm-bytes", "64MiB", "--gpu-backend", "host"});
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(file->core.hbm.eviction, EvictionPolicyKind::kS3Fifo);
  EXPECT_EQ(file->core.dram_eviction, EvictionPolicyKind::kLru);

  EXPECT_TRUE(Names(ErrorOf({"--dram-eviction", "clock"}),
                    "--dram-eviction: eviction policy 'clock' is unknown (lru, s3fifo, arc)"));
  const std::string bad = WriteConfig("log_level: info\nnvme_eviction: LRU\n");
  EXPECT_TRUE(Names(ErrorOf({"--config", bad}),
                    "config " + bad + ":2: nvme_eviction: eviction policy 'LRU' is unknown"));
  // Given for a tier that is off: it starts, and says so.
  auto off = Parse({"--nvme-bytes", "0", "--nvme-eviction", "s3fifo", "--hbm-eviction", "s3fifo"});
  ASSERT_TRUE(off.ok()) << off.status().ToString();
  ASSERT_EQ(off->ignored.size(), 2u);
  EXPECT_TRUE(Names(off->ignored[0], "--nvme-eviction has no effect: --nvme-bytes 0"));
  EXPECT_TRUE(Names(off->ignored[1], "--hbm-eviction has no effect: --hbm-bytes 0"));
}

// A review found --nvme-path ignored when the config file gave nvme_paths (its
// flag is --nvme-path, not --nvme-paths): flags win over the file.
TEST_F(DaemonOptionsTest, NvmePathFlagsWinOverTheConfigFilesNvmePaths) {
  const std::string cfg = WriteConfig("nvme_paths: [/tmp/from-config]\nnvme_bytes: 16MiB\n");
  auto r = Parse({"--config", cfg, "--nvme-path", "/tmp/from-flag"});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->core.nvme.paths, std::vector<std::string>{"/tmp/from-flag"});
  const std::string error = ErrorOf({"--config", cfg, "--nvme-bytes", "0", "--nvme-path", "/x"});
  EXPECT_TRUE(Names(error, "--nvme-bytes 0")) << error;
  EXPECT_TRUE(Names(error, "--nvme-path")) << error;
}

// A review found size and range errors naming the YAML key for a bad flag, and
// leaving out the config file for a bad value in it.
TEST_F(DaemonOptionsTest, EveryCheckedValueNamesItsFlagOrItsConfigFileAndKey) {
  struct Case {
    const char* key;
    const char* bad;
  };
  for (const Case c :
       {Case{"dram_bytes", "12XB"}, Case{"session_max_bytes", "lots"},
        Case{"drain_timeout_ms", "-1"}, Case{"nvme_bytes", "5000"}, Case{"nvme_queue_depth", "0"},
        Case{"nvme_workers", "65"}, Case{"selective_min_hits", "0"},
        Case{"nvme_write_policy", "never"}, Case{"hbm_bytes", "5000"}, Case{"gpu", "-3"},
        Case{"gpu_backend", "tpu"}, Case{"dram_bytes", "5000"}, Case{"lease_ttl_ms", "99"},
        Case{"reservation_ttl_ms", "99"}, Case{"log_level", "loud"}}) {
    std::string flag = std::string("--") + c.key;
    std::replace(flag.begin(), flag.end(), '_', '-');
    const std::string by_flag = ErrorOf({flag, c.bad});
    EXPECT_TRUE(Names(by_flag, flag)) << c.key;
    const std::string cfg = WriteConfig(std::string(c.key) + ": " + c.bad + "\n");
    const std::string by_config = ErrorOf({"--config", cfg});
    EXPECT_TRUE(Names(by_config, "config " + cfg + ":1: " + c.key)) << c.key;
  }
}

// A review found a bad value in a config file named by key only: in a long file the
// line says where (FILE:LINE, as compilers write it).
TEST_F(DaemonOptionsTest, ABadValueInAConfigFileNamesItsLine) {
  const std::string cfg = WriteConfig(
      "# kvtierd\nlog_level: info\n\nnvme_bytes: 1GiB\n"
      "nvme_write_policy: bogus\n");
  EXPECT_TRUE(Names(ErrorOf({"--config", cfg}), "config " + cfg + ":5: nvme_write_policy"))
      << ErrorOf({"--config", cfg});
  const std::string flagged = ErrorOf({"--config", cfg, "--nvme-write-policy", "never"});
  EXPECT_TRUE(Names(flagged, "--nvme-write-policy")) << flagged;
  // An empty path in a block list: the line of the path, not of the key.
  const std::string paths = WriteConfig("nvme_bytes: 1GiB\nnvme_paths:\n  - /tmp\n  - \"\"\n");
  EXPECT_TRUE(Names(ErrorOf({"--config", paths}), "config " + paths +
                                                      ":4: nvme_paths gives an "
                                                      "empty path"))
      << ErrorOf({"--config", paths});
  const std::string socket = WriteConfig("log_level: info\nsocket: \"\"\n");
  EXPECT_TRUE(Names(ErrorOf({"--config", socket}), "config " + socket + ":2: socket is empty"))
      << ErrorOf({"--config", socket});
}

// A config file that sets nothing (empty, or comments only) is likely the wrong file:
// kvtierd says so at start rather than run on its defaults silently.
TEST_F(DaemonOptionsTest, AConfigFileThatSetsNothingIsNamedAtStart) {
  for (const char* text : {"", "# nothing here\n", "{}\n", "~\n"}) {
    const std::string cfg = WriteConfig(text);
    auto r = Parse({"--config", cfg});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->ignored.size(), 1u) << "'" << text << "'";
    EXPECT_TRUE(Names(r->ignored[0], "config " + cfg + " sets nothing")) << r->ignored[0];
  }
  auto set = Parse({"--config", WriteConfig("log_level: info\n")});
  ASSERT_TRUE(set.ok());
  EXPECT_TRUE(set->ignored.empty());
}

TEST_F(DaemonOptionsTest, BadHbmValuesNameTheirSource) {
  EXPECT_NE(ErrorOf({"--hbm-bytes", "5000"}).find("--hbm-bytes 5000 is not a multiple of 4096"),
            std::string::npos);
  EXPECT_NE(ErrorOf({"--hbm-bytes", "lots"}).find("--hbm-bytes"), std::string::npos);
  EXPECT_NE(ErrorOf({"--gpu", "4096"}).find("--gpu 4096 is outside 0..1023"), std::string::npos);
  EXPECT_NE(ErrorOf({"--gpu-backend", "tpu"}).find("'tpu'"), std::string::npos);
  const std::string cfg = WriteConfig("hbm_bytes: 1000\n");
  EXPECT_NE(ErrorOf({"--config", cfg}).find("config " + cfg + ":1: hbm_bytes 1000"),
            std::string::npos);
  const std::string cfg2 = WriteConfig("gpu: -3\n");
  EXPECT_NE(ErrorOf({"--config", cfg2}).find("config " + cfg2 + ":1: gpu -3"), std::string::npos);
}

}  // namespace
}  // namespace kvtier
