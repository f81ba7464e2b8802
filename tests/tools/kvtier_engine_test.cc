// kvtier-engine end to end: a real kvtierd, the engine on host emulation with small shapes
// (tiny-engine). Asserts what the run must show (exit status, bytes verified, the JSON's
// three TTFTs and overlap ratio), never timing thresholds.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "testing/daemon_process.h"

namespace kvtier {
namespace {

using testing::BinPath;
using testing::CommandResult;
using testing::DaemonProcess;
using testing::ReadFileOrEmpty;
using testing::RunCommand;
using testing::TempDir;
using namespace std::chrono_literals;

// tiny-engine: 4 layers, 2 KV heads, head_dim 16, fp16.
constexpr int64_t kLayers = 4, kKvHeads = 2, kHeadDim = 16;
constexpr int64_t kPromptTokens = 600, kCachedTokens = 512, kIterations = 2;

class KvtierEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DaemonProcess::Options o;
    o.socket_path = dir_.Sub("kvtierd.sock");
    daemon_ = std::make_unique<DaemonProcess>(o);
    ASSERT_EQ(daemon_->Start(), "");
  }

  CommandResult Engine(std::vector<std::string> args) {
    std::vector<std::string> argv = {BinPath("kvtier-engine"), "--backend", "host", "--model",
                                     "tiny-engine"};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv, 120s);
  }

  TempDir dir_{"kvtier-engine"};
  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(KvtierEngineTest, ServesOnePromptThreeWaysAndVerifiesEveryLoadedByte) {
  const std::string json_path = dir_.Sub("engine.json");
  const CommandResult r =
      Engine({"--socket", daemon_->socket_path(), "--prompt-tokens", std::to_string(kPromptTokens),
              "--cached-tokens", std::to_string(kCachedTokens), "--iterations",
              std::to_string(kIterations), "--json", json_path});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_NE(r.out.find("verify: OK"), std::string::npos) << r.out;
  const nlohmann::json j = nlohmann::json::parse(ReadFileOrEmpty(json_path), nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << ReadFileOrEmpty(json_path);

  for (const char* way : {"recompute", "load_then_compute", "layerwise"}) {
    ASSERT_TRUE(j["ttft_ms"].contains(way)) << way;
    ASSERT_TRUE(j["ttft_ms"][way].is_number()) << way;
    EXPECT_GT(j["ttft_ms"][way].get<double>(), 0) << way;
  }
  ASSERT_TRUE(j["overlap_ratio"].is_number());
  EXPECT_GT(j["overlap_ratio"].get<double>(), 0);
  for (const char* key : {"load_only_ms", "compute_only_ms", "recompute_tflops",
                          "plain_gemm_tflops", "recompute_vs_gemm_ratio"}) {
    ASSERT_TRUE(j[key].is_number()) << key;
    EXPECT_GT(j[key].get<double>(), 0) << key;
  }

  // Two chunks of 256 tokens were stored; every load (load-only, (b), (c), per iteration)
  // was compared with them: K and V rows of head_dim fp16 values per KV head.
  EXPECT_EQ(j["stored_chunks"], kCachedTokens / 256);
  const int64_t per_load = kCachedTokens * kLayers * 2 * kKvHeads * kHeadDim * 2;
  EXPECT_EQ(j["verify"]["ok"], true);
  EXPECT_EQ(j["verify"]["compared_bytes"], 3 * kIterations * per_load);
  EXPECT_EQ(j["verify"]["differing_rows"], 0);
  EXPECT_GT(j["verify"]["control_differing_rows"].get<int64_t>(), 0)
      << "before loading, the serving cache must differ from the stored KV";
  // Host emulation is deterministic: the first token's logits computed over loaded KV are
  // those of the full recompute, bit for bit.
  EXPECT_EQ(j["logits_max_abs_diff"]["load_then_compute"], 0.0);
  EXPECT_EQ(j["logits_max_abs_diff"]["layerwise"], 0.0);
}

TEST_F(KvtierEngineTest, JsonToStdoutIsTheJsonAloneAndAnUnwritablePathFailsBeforeTheRun) {
  const CommandResult r = Engine(
      {"--socket", daemon_->socket_path(), "--prompt-tokens", std::to_string(kPromptTokens),
       "--cached-tokens", std::to_string(kCachedTokens), "--iterations", "1", "--json", "-"});
  ASSERT_TRUE(r.ok()) << r.Describe();
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << "stdout is not JSON: " << r.out;
  EXPECT_NE(r.err.find("verify: OK"), std::string::npos) << "the table goes to stderr: " << r.err;

  const CommandResult bad =
      Engine({"--socket", daemon_->socket_path(), "--prompt-tokens", std::to_string(kPromptTokens),
              "--cached-tokens", std::to_string(kCachedTokens), "--json",
              dir_.Sub("no-such-dir/engine.json")});
  EXPECT_TRUE(bad.exit.exited && bad.exit.exit_code == 2) << bad.Describe();
  EXPECT_NE(bad.err.find("--json: cannot write"), std::string::npos) << bad.err;
  EXPECT_EQ(bad.out.find("kvtier-engine:"), std::string::npos) << "it ran before checking";
}

TEST_F(KvtierEngineTest, RefusesACachedPrefixThatIsNotWholeChunks) {
  const CommandResult r = Engine(
      {"--socket", daemon_->socket_path(), "--prompt-tokens", "600", "--cached-tokens", "300"});
  EXPECT_TRUE(r.exit.exited && r.exit.exit_code == 2) << r.Describe();
  EXPECT_NE(r.err.find("--cached-tokens"), std::string::npos) << r.err;
}

TEST_F(KvtierEngineTest, FailsWhenTheDaemonIsNotThere) {
  const CommandResult r = Engine({"--socket", dir_.Sub("nobody.sock"), "--prompt-tokens", "600",
                                  "--cached-tokens", "512", "--deadline-ms", "200"});
  EXPECT_TRUE(r.exit.exited && r.exit.exit_code == 1) << r.Describe();
}

}  // namespace
}  // namespace kvtier
