// The test helpers' sanitizer check: a report in a child's stderr fails the current test.
#include "testing/daemon_process.h"

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

namespace kvtier::testing {
namespace {

using namespace std::chrono_literals;

constexpr const char* kAsanReport =
    "==4242==ERROR: AddressSanitizer: heap-use-after-free on address 0x602000000010\n"
    "READ of size 8 at 0x602000000010 thread T3\n"
    "    #0 0x55 in kvtier::CacheCore::Lookup daemon/src/cache_core.cc:120\n";

// Runs `/bin/sh -c script` as a ChildProcess whose stdout and stderr go to `log`, and waits.
void SpawnAndWait(const std::string& script, const std::string& log) {
  ChildProcess child;
  std::string error;
  ASSERT_TRUE(child.Spawn({"/bin/sh", "-c", script}, log, log, &error)) << error;
  ASSERT_TRUE(child.Wait(10s).has_value());
}

// Starts a child that writes a TSan report and then sleeps, and kills it (SIGKILL) once the
// report is written.
void SpawnReportAndKill(const TempDir& dir) {
  ChildProcess child;
  std::string error;
  const std::string script = "echo 'WARNING: ThreadSanitizer: data race' >&2; echo ready > " +
                             dir.Sub("ready") + "; exec sleep 60";
  ASSERT_TRUE(child.Spawn({"/bin/sh", "-c", script}, dir.Sub("out"), dir.Sub("err"), &error))
      << error;
  for (int i = 0; i < 1000 && ReadFileOrEmpty(dir.Sub("ready")).empty(); ++i) {
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_TRUE(child.running());
  child.Kill();
}

TEST(SanitizerReportTest, FindsEachSanitizersReport) {
  EXPECT_EQ(SanitizerReport(std::string("[info] serving\n") + kAsanReport), kAsanReport);
  EXPECT_NE(SanitizerReport("==1==ERROR: LeakSanitizer: detected memory leaks\n"), "");
  EXPECT_NE(SanitizerReport("WARNING: ThreadSanitizer: data race (pid=7)\n"), "");
  EXPECT_NE(SanitizerReport("slot.cc:9:3: runtime error: signed integer overflow\n"), "");
  EXPECT_NE(SanitizerReport("SUMMARY: UndefinedBehaviorSanitizer: undefined-behavior x.cc:1"), "");
}

TEST(SanitizerReportTest, OrdinaryLogsAndOutputAreNotReports) {
  EXPECT_EQ(SanitizerReport(""), "");
  EXPECT_EQ(SanitizerReport("[2025-01-01 00:00:00] [warning] nvme: 3 lost writes\n"
                            "[error] ERROR: index refused the write\n"
                            "kvtier-replay summary (trace, model tiny)\n"
                            "==7==WARNING: AddressSanitizer failed to allocate 0x4000 bytes\n"),
            "");
}

TEST(ChildProcessSanitizerTest, AReportInAChildsStderrFailsTheTest) {
  EXPECT_NONFATAL_FAILURE(
      {
        TempDir dir;
        SpawnAndWait(std::string("printf '%s' '") + kAsanReport + "' >&2; exit 86",
                     dir.Sub("child.log"));
      },
      "AddressSanitizer: heap-use-after-free");
}

TEST(ChildProcessSanitizerTest, AReportFromAnEarlierRunOfTheSameLogDoesNotCountAgain) {
  TempDir dir;
  const std::string log = dir.Sub("daemon.log");
  EXPECT_NONFATAL_FAILURE(SpawnAndWait(std::string("printf '%s' '") + kAsanReport + "' >&2", log),
                          "heap-use-after-free");
  // The second child appends to the same file without a report: no failure.
  SpawnAndWait("echo restarted >&2", log);
  EXPECT_NE(ReadFileOrEmpty(log).find("restarted"), std::string::npos);
}

TEST(ChildProcessSanitizerTest, AKilledChildsReportStillFailsTheTest) {
  TempDir dir;
  EXPECT_NONFATAL_FAILURE(SpawnReportAndKill(dir), "ThreadSanitizer: data race");
}

TEST(RunCommandSanitizerTest, AReportInTheCommandsStderrFailsTheTest) {
  EXPECT_NONFATAL_FAILURE(
      RunCommand(
          {"/bin/sh", "-c", "echo 'x.cc:1:2: runtime error: load of misaligned address' >&2"}),
      "runtime error: load of misaligned address");
  CommandResult clean = RunCommand({"/bin/sh", "-c", "echo fine >&2"});
  EXPECT_TRUE(clean.ok()) << clean.Describe();
}

}  // namespace
}  // namespace kvtier::testing
