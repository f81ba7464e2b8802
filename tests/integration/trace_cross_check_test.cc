// The full-trace cross-check of the foundation issue: the whole Mooncake
// conversation trace, 512-token chunks, model tiny, a DRAM tier of exactly
// 5,859 slots (3M tokens), one request at a time. The LRU reference for
// full-chunk storage is a token hit rate of 0.144 (+- 0.01), computed outside
// kvtier by a plain simulation of the trace; an unbounded cache gives 0.373.
// Label stress: about a minute on 2 cores. Skips when the trace is absent.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "kvtier/slot_image.h"
#include "kvtier/tools/model_presets.h"
#include "testing/daemon_process.h"

namespace kvtier::testing {
namespace {

TEST(TraceCrossCheck, WholeConversationTraceMatchesLruReferenceWithZeroVerifyErrors) {
  const std::string trace = ConversationTracePath();
  if (!std::filesystem::exists(trace)) GTEST_SKIP() << trace << " is not present";
  auto spec = tools::ModelPreset("tiny", 512);
  ASSERT_TRUE(spec.ok());
  const uint64_t slot_bytes = SlotLayout::For(*spec).slot_bytes;
  TempDir dir("kvtier-crosscheck");
  DaemonProcess::Options o;
  o.socket_path = dir.Sub("d.sock");
  o.dram_bytes = std::to_string(5859 * slot_bytes);
  DaemonProcess daemon(o);
  ASSERT_EQ(daemon.Start(), "");

  const std::string json_path = dir.Sub("replay.json");
  CommandResult r = RunCommand(
      {BinPath("kvtier-replay"), "--socket", o.socket_path, "--trace", trace, "--model", "tiny",
       "--chunk-tokens", "512", "--quiet", "--deadline-ms", "5000", "--json", json_path},
      std::chrono::minutes(10));
  ASSERT_TRUE(r.ok()) << r.Describe();
  const auto j = nlohmann::json::parse(ReadFileOrEmpty(json_path));
  EXPECT_EQ(j["requests"].get<uint64_t>(), 12031u);
  EXPECT_EQ(j["verify_errors"].get<uint64_t>(), 0u);
  EXPECT_EQ(j["fail_open"].get<uint64_t>(), 0u);
  EXPECT_NEAR(j["token_hit_rate"].get<double>(), 0.144, 0.01) << r.out;

  CommandResult stats = daemon.Ctl({"--json", "stats"});
  ASSERT_TRUE(stats.ok()) << stats.Describe();
  const auto s = nlohmann::json::parse(stats.out);
  EXPECT_EQ(s["tiers"][0]["capacity_chunks"].get<uint64_t>(), 5859u);
  EXPECT_EQ(s["tiers"][0]["chunks"].get<uint64_t>(), 5859u);
}

}  // namespace
}  // namespace kvtier::testing
