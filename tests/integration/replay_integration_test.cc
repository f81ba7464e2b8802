// kvtier-replay against the real kvtierd: its token hit rate counts only the
// verified leading run of each load (issue 10, item 10: it used to add the
// tokens of chunks that failed verification).
#include <cstring>
#include <fstream>

#include "integration/daemon_test_fixture.h"
#include "kvtier/client.h"
#include "kvtier/tools/model_presets.h"
#include "kvtier/tools/synthetic_kv.h"

namespace kvtier::integration {
namespace {

using ReplayTest = DaemonTest;

TEST_F(ReplayTest, HitTokensCountOnlyTheVerifiedLeadingRun) {
  DaemonProcess daemon(Opts());
  ASSERT_EQ(daemon.Start(), "");
  // One request of 4 trace blocks (2,048 tokens): 8 chunks of 256 tokens.
  const std::vector<uint64_t> blocks = {0, 1, 2, 3};
  const std::string trace = dir_.Sub("one.jsonl");
  std::ofstream(trace) << R"({"timestamp": 0, "input_length": 2048, "output_length": 1, )"
                       << R"("hash_ids": [0, 1, 2, 3]})"
                       << "\n";

  // Store the prompt as kvtier-replay would, except that chunk 3 holds wrong bytes.
  auto spec = tools::ModelPreset("tiny", 256);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  ClientOptions o;
  o.socket_path = socket_;
  o.deadline = std::chrono::milliseconds(2000);
  auto client = Client::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto ns = (*client)->OpenNamespace(*spec);
  ASSERT_TRUE(ns.ok()) << ns.status().ToString();
  const std::vector<int32_t> tokens = tools::SynthesizePrompt(blocks, 2048);
  const std::vector<ChunkKey> keys = Client::ChunkKeys(*ns, tokens);
  ASSERT_EQ(keys.size(), 8u);
  auto stored = (*client)->Store(*ns, tokens, [&](size_t i, std::span<std::byte> payload) {
    tools::FillPayload(keys[i], spec->num_layers, payload);
    if (i == 3) payload[payload.size() / 2] ^= std::byte{0x5A};
    return Status::Ok();
  });
  ASSERT_TRUE(stored.ok() && stored->fail_open.ok() && stored->stored_chunks == 8u);
  (*client)->Close();

  const CommandResult r =
      RunCommand({BinPath("kvtier-replay"), "--socket", socket_, "--trace", trace, "--quiet",
                  "--deadline-ms", "2000", "--json", dir_.Sub("replay.json")},
                 60s);
  EXPECT_EQ(r.exit.exit_code, 3) << "verify errors exit 3\n" << r.Describe();
  const json j = json::parse(ReadFileOrEmpty(dir_.Sub("replay.json")), nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.Describe();
  EXPECT_EQ(j["verify_errors"].get<uint64_t>(), 1u);
  EXPECT_EQ(j["prompt_tokens"].get<uint64_t>(), 2048u);
  EXPECT_EQ(j["hit_tokens"].get<uint64_t>(), 3u * 256u) << "chunks 0-2 verified; 3 failed";
  EXPECT_EQ(j["chunks_loaded"].get<uint64_t>(), 3u);

  // The daemon counted the replay's one request once: its 2,048 prompt tokens
  // (the Store above made no Lookup) and the 8 chunks it leased.
  const json s = Stats(daemon);
  EXPECT_EQ(s["lookup_tokens"].get<uint64_t>(), 2048u);
  EXPECT_EQ(s["hit_tokens"].get<uint64_t>(), 2048u);
}

// A --json path that cannot be written is refused before the replay, not
// after it (it used to run the whole trace, then say "cannot write").
TEST_F(ReplayTest, AJsonPathThatCannotBeWrittenIsRefusedBeforeTheRun) {
  const std::string missing = dir_.Sub("no-such-dir/out.json");
  // No daemon at this socket: a check before the run answers first.
  CommandResult r = RunCommand({BinPath("kvtier-replay"), "--socket", dir_.Sub("nobody.sock"),
                                "--generate", "3", "--quiet", "--json", missing},
                               30s);
  EXPECT_EQ(r.exit.exit_code, 2) << r.Describe();
  EXPECT_NE(r.err.find("--json " + missing), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("not reachable"), std::string::npos) << "it tried the run first: " << r.err;
  // A folder is not a file to write.
  r = RunCommand({BinPath("kvtier-replay"), "--socket", dir_.Sub("nobody.sock"), "--generate", "3",
                  "--quiet", "--json", dir_.Sub("")},
                 30s);
  EXPECT_EQ(r.exit.exit_code, 2) << r.Describe();
  EXPECT_NE(r.err.find("is a folder"), std::string::npos) << r.err;
}

// No daemon, or a path that is no socket: exit 1 ("not reachable at the start"),
// naming the path, as kvtierctl does (a regular file was exit 2, a usage error).
TEST_F(ReplayTest, ASocketPathWithNoDaemonExitsOneNamingThePath) {
  const std::string file = dir_.Sub("regular-file");
  ASSERT_TRUE(testing::WriteFile(file, "x"));
  for (const std::string& path : {file, dir_.Sub("nobody.sock")}) {
    const CommandResult r =
        RunCommand({BinPath("kvtier-replay"), "--socket", path, "--generate", "3", "--quiet"}, 30s);
    EXPECT_TRUE(r.exit.exited && r.exit.exit_code == 1) << r.Describe();
    EXPECT_NE(r.err.find(path), std::string::npos) << r.Describe();
  }
}

// `--json -` is JSON alone on stdout: the table goes to stderr, and so do the
// SDK's log lines (spdlog's default logger wrote them to stdout, in front of a
// tool's results). Before, `-` was a file of that name, and the warning below
// came out on stdout.
TEST_F(ReplayTest, JsonToStdoutIsJsonAloneWithTheLogsOnStderr) {
  DaemonProcess daemon(Opts());
  ASSERT_EQ(daemon.Start(), "");
  const CommandResult r =
      RunCommand({"/usr/bin/env", "KVTIER_CONTROL_RING=disabled", BinPath("kvtier-replay"),
                  "--socket", socket_, "--generate", "5", "--quiet", "--json", "-"},
                 60s);
  EXPECT_TRUE(r.ok()) << r.Describe();
  const json j = json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << "stdout is not JSON alone:\n" << r.out;
  EXPECT_EQ(j["requests"].get<uint64_t>(), 5u);
  EXPECT_NE(r.err.find("KVTIER_CONTROL_RING='disabled'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("token hit rate"), std::string::npos) << "the table goes to stderr\n"
                                                             << r.err;
}

}  // namespace
}  // namespace kvtier::integration
