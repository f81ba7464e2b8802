// kvtier-gpu-e2e (what make gpu-bundle runs on a GPU machine) against a real
// kvtierd, on the gpu module's host emulation.
#include <gtest/gtest.h>

#include "testing/daemon_process.h"

namespace kvtier::testing {
namespace {

using namespace std::chrono_literals;

TEST(GpuE2eTest, StoresAndLoadsThroughTheDaemonAndVerifiesEveryByte) {
  TempDir dir("kvtier-gpu-e2e");
  DaemonProcess::Options o;
  o.socket_path = dir.Sub("kvtierd.sock");
  o.dram_bytes = "128MiB";
  DaemonProcess daemon(o);
  ASSERT_EQ(daemon.Start(), "");
  CommandResult r =
      RunCommand({BinPath("kvtier-gpu-e2e"), "--socket", o.socket_path, "--backend", "host",
                  "--layers", "4", "--kv-heads", "2", "--head-dim", "64", "--block-size", "16",
                  "--chunk-tokens", "64", "--prompt-tokens", "1000"},
                 120s);
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_NE(r.out.find("verified: 0 mismatched token planes of 7680"), std::string::npos)
      << r.out;  // 4 layers x 2 planes x 960 tokens (15 full chunks)
  EXPECT_NE(r.out.find("GB/s"), std::string::npos) << r.out;
  // The first store, which registers the arena, is timed apart from the prompt's store.
  EXPECT_NE(r.out.find("first store of the client (one chunk; registers the whole arena"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("store (D2H into the arena, layerwise)"), std::string::npos) << r.out;
}

TEST(GpuE2eTest, WithAnHbmTierTheSecondLoadComesFromTheHbmPoolAndMatches) {
  TempDir dir("kvtier-gpu-e2e");
  DaemonProcess::Options o;
  o.socket_path = dir.Sub("kvtierd.sock");
  o.dram_bytes = "128MiB";
  o.extra_args = {"--hbm-bytes", "64MiB", "--gpu-backend", "host"};
  DaemonProcess daemon(o);
  ASSERT_EQ(daemon.Start(), "");
  CommandResult r =
      RunCommand({BinPath("kvtier-gpu-e2e"), "--socket", o.socket_path, "--backend", "host",
                  "--layers", "4", "--kv-heads", "2", "--head-dim", "64", "--block-size", "16",
                  "--chunk-tokens", "64", "--prompt-tokens", "1000", "--require-hbm"},
                 120s);
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_NE(r.out.find("verified: 0 mismatched token planes of 7680"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(15 of 15 chunks from HBM)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("verified (HBM load): 0 mismatched token planes of 7680"), std::string::npos)
      << r.out;
}

TEST(GpuE2eTest, WithoutADaemonItFailsWithAClearMessage) {
  TempDir dir("kvtier-gpu-e2e");
  CommandResult r = RunCommand(
      {BinPath("kvtier-gpu-e2e"), "--socket", dir.Sub("none.sock"), "--backend", "host"}, 60s);
  EXPECT_EQ(r.exit.exit_code, 1) << r.Describe();
  EXPECT_NE(r.err.find("not reachable"), std::string::npos) << r.Describe();
}

}  // namespace
}  // namespace kvtier::testing
