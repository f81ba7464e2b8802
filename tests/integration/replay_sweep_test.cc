// kvtier-replay --sweep and --rate against real kvtierd processes (issue 12):
// the sweep starts its own daemon a point; --rate replays at trace times.
#include <fstream>
#include <sstream>

#include "integration/daemon_test_fixture.h"

namespace kvtier::integration {
namespace {

using ReplaySweepTest = DaemonTest;

constexpr uint64_t kSlotBytes = 266240;  // model tiny, 512-token chunks: 2,304 B header + 256 KiB

std::vector<std::vector<std::string>> ReadCsv(const std::string& path) {
  std::vector<std::vector<std::string>> rows;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> cells;
    std::stringstream ss(line);
    std::string cell;
    while (std::getline(ss, cell, ',')) cells.push_back(cell);
    rows.push_back(cells);
  }
  return rows;
}

bool OnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "");
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    if (access((dir + "/" + name).c_str(), X_OK) == 0) return true;
  }
  return false;
}

// Two points, 16 and 1,024 chunks of 512 tokens, on the conversation trace's
// first 200 requests: a row each, in order, hit rate not falling with
// capacity, the offline Belady at or above the offline LRU, kvtier's measured
// rate near the LRU's (the daemon's policy is a leaf-first LRU), and a PNG.
TEST_F(ReplaySweepTest, TwoPointsWriteTwoRowsAndAPlot) {
  const std::string csv = dir_.Sub("sweep.csv");
  const std::string png = dir_.Sub("sweep.png");
  const std::string spec =
      "dram=" + std::to_string(16 * kSlotBytes) + "," + std::to_string(1024 * kSlotBytes);
  const CommandResult r = RunCommand(
      {BinPath("kvtier-replay"), "--trace", testing::ConversationTracePath(), "--limit", "200",
       "--chunk-tokens", "512", "--deadline-ms", "5000", "--quiet", "--sweep", spec, "--csv", csv},
      120s);
  ASSERT_TRUE(r.ok()) << r.Describe();
  const auto rows = ReadCsv(csv);
  ASSERT_EQ(rows.size(), 3u) << "a header and 2 rows\n" << ReadFileOrEmpty(csv);
  const auto& head = rows[0];
  const auto col = [&](const std::string& name) {
    const auto it = std::find(head.begin(), head.end(), name);
    EXPECT_NE(it, head.end()) << name;
    return static_cast<size_t>(it - head.begin());
  };
  const size_t rate = col("token_hit_rate"), lru = col("lru_hit_rate"),
               opt = col("belady_hit_rate"), chunks = col("capacity_chunks"),
               requests = col("requests"), dram = col("dram_bytes");
  for (size_t i = 1; i < rows.size(); ++i) {
    ASSERT_EQ(rows[i].size(), head.size()) << i;
    EXPECT_EQ(rows[i][requests], "200") << i;
    EXPECT_GE(std::stod(rows[i][opt]), std::stod(rows[i][lru])) << i;
    EXPECT_NEAR(std::stod(rows[i][rate]), std::stod(rows[i][lru]), 0.02) << i;
  }
  EXPECT_EQ(rows[1][dram], std::to_string(16 * kSlotBytes));
  EXPECT_EQ(rows[1][chunks], "16");
  EXPECT_EQ(rows[2][chunks], "1024");
  EXPECT_GE(std::stod(rows[2][rate]), std::stod(rows[1][rate]));
  EXPECT_GT(std::stod(rows[2][rate]), 0.0) << "1,024 chunks hold the shared prefixes";
  if (!OnPath("gnuplot")) GTEST_SKIP() << "gnuplot not installed: no PNG to check";
  const std::string bytes = ReadFileOrEmpty(png);
  ASSERT_GE(bytes.size(), 8u) << r.Describe();
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
}

// --rate at 200x the trace's clock on 3 clients replays every request once,
// as many as the closed loop (same prompt tokens), and says it ran at trace
// times; --progress draws its line on stderr only.
TEST_F(ReplaySweepTest, RateWithSpeedupReplaysEveryRequest) {
  DaemonProcess daemon(Opts());
  ASSERT_EQ(daemon.Start(), "");
  const std::vector<std::string> base = {BinPath("kvtier-replay"),
                                         "--socket",
                                         socket_,
                                         "--trace",
                                         testing::ConversationTracePath(),
                                         "--limit",
                                         "60",
                                         "--deadline-ms",
                                         "5000"};
  std::vector<std::string> at_rate = base;
  at_rate.insert(at_rate.end(), {"--quiet", "--rate", "--clients", "3", "--speedup", "200",
                                 "--json", dir_.Sub("rate.json")});
  const CommandResult r = RunCommand(at_rate, 60s);
  ASSERT_TRUE(r.ok()) << r.Describe();
  const json j = json::parse(ReadFileOrEmpty(dir_.Sub("rate.json")), nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.Describe();
  EXPECT_EQ(j["requests"].get<uint64_t>(), 60u);
  EXPECT_EQ(j["mode"]["kind"], "trace_times");
  EXPECT_EQ(j["mode"]["clients"].get<uint32_t>(), 3u);
  EXPECT_EQ(j["verify_errors"].get<uint64_t>(), 0u);
  EXPECT_NE(r.out.find("at trace times"), std::string::npos) << r.out;

  // The closed loop, with --progress (stderr is no terminal here): the
  // progress line, its ETA and the last request's count go to stderr alone.
  std::vector<std::string> closed = base;
  closed.insert(closed.end(), {"--progress", "--json", dir_.Sub("closed.json")});
  const CommandResult c = RunCommand(closed, 60s);
  ASSERT_TRUE(c.ok()) << c.Describe();
  EXPECT_NE(c.err.find("[60/60] 100.0%"), std::string::npos) << c.err;
  EXPECT_NE(c.err.find("ETA"), std::string::npos) << c.err;
  EXPECT_EQ(c.out.find("ETA"), std::string::npos) << c.out;
  const json k = json::parse(ReadFileOrEmpty(dir_.Sub("closed.json")), nullptr, false);
  ASSERT_FALSE(k.is_discarded()) << c.Describe();
  EXPECT_EQ(k["requests"], j["requests"]);
  EXPECT_EQ(k["prompt_tokens"], j["prompt_tokens"]);
  EXPECT_EQ(k["mode"]["kind"], "closed_loop");
}

// A bad --sweep is a usage error (exit 2) naming the bad piece, before any
// daemon starts.
TEST_F(ReplaySweepTest, BadSweepValuesExitTwoNamingTheValue) {
  const std::vector<std::pair<std::string, std::string>> cases = {{"dram=", "'dram='"},
                                                                  {"dram=abc", "'abc'"},
                                                                  {"foo=1", "'foo'"},
                                                                  {"dram=1GiB,nvme=", "'nvme='"}};
  for (const auto& [value, named] : cases) {
    const CommandResult r = RunCommand({BinPath("kvtier-replay"), "--generate", "3", "--quiet",
                                        "--sweep", value, "--csv", dir_.Sub("bad.csv")},
                                       30s);
    EXPECT_TRUE(r.exit.exited && r.exit.exit_code == 2) << value << "\n" << r.Describe();
    EXPECT_NE(r.err.find(named), std::string::npos) << value << "\n" << r.err;
    EXPECT_NE(r.err.find("--sweep"), std::string::npos) << value << "\n" << r.err;
  }
}

}  // namespace
}  // namespace kvtier::integration
