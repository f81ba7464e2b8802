// DaemonTest: the fixture and helpers the kvtierd integration tests share (a
// daemon on <tmp>/run/kvtierd.sock, kvtierctl JSON parsing, bounded waits).
#pragma once

#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "testing/daemon_process.h"

namespace kvtier::integration {

using json = nlohmann::json;
using testing::BinPath;
using testing::ChildProcess;
using testing::CommandResult;
using testing::DaemonProcess;
using testing::ExitInfo;
using testing::ReadFileOrEmpty;
using testing::RunCommand;
using testing::TempDir;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

inline int64_t MsSince(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

// Polls `pred` every `every` until it holds or `timeout` passes.
inline bool WaitFor(const std::function<bool()>& pred, std::chrono::milliseconds timeout,
                    std::chrono::milliseconds every = 20ms) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    if (pred()) return true;
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(every);
  }
}

inline bool Exists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

// Parses stdout of a `kvtierctl --json ...` run; a discarded value on failure.
inline json ParseJson(const CommandResult& r) {
  return json::parse(r.out, nullptr, /*allow_exceptions=*/false);
}

// The JSON object after `marker ` on the first line of `text` that starts with it.
inline json JsonAfterMarker(const std::string& text, const std::string& marker) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(pos, end - pos);
    if (line.rfind(marker + " ", 0) == 0) {
      return json::parse(line.substr(marker.size() + 1), nullptr, false);
    }
    pos = end + 1;
  }
  return json(json::value_t::discarded);
}

// A daemon on <tmp>/run/kvtierd.sock (the run/ directory does not exist yet).
class DaemonTest : public ::testing::Test {
 protected:
  DaemonTest() : socket_(dir_.Sub("run/kvtierd.sock")) {}

  DaemonProcess::Options Opts(std::vector<std::string> extra = {}) {
    DaemonProcess::Options o;
    o.socket_path = socket_;
    o.dram_bytes = "64MiB";
    o.extra_args = std::move(extra);
    o.log_path = dir_.Sub("kvtierd.log");
    return o;
  }

  // `kvtier_test_client store-load` against the daemon: some traffic.
  CommandResult StoreLoad(const char* seed, const char* requests) {
    return RunCommand({BinPath("kvtier_test_client"), "store-load", "--socket", socket_, "--seed",
                       seed, "--requests", requests},
                      60s);
  }

  // `kvtierctl --json stats`, parsed; fails the test when it does not parse.
  json Stats(DaemonProcess& d) {
    CommandResult r = d.Ctl({"--json", "stats"});
    json j = ParseJson(r);
    EXPECT_TRUE(r.ok() && !j.is_discarded()) << r.Describe();
    return j;
  }

  // Spawns `kvtier_test_client hold` as `holder` and waits up to 30 s for its
  // HOLDING line (a lease and a reservation it never gives back); fails the
  // test (returning a discarded value) when none comes.
  json SpawnHolder(ChildProcess& holder) {
    std::string err;
    if (!holder.Spawn({BinPath("kvtier_test_client"), "hold", "--socket", socket_},
                      dir_.Sub("hold.out"), dir_.Sub("hold.err"), &err)) {
      ADD_FAILURE() << err;
      return json(json::value_t::discarded);
    }
    json held(json::value_t::discarded);
    WaitFor(
        [&] {
          held = JsonAfterMarker(ReadFileOrEmpty(dir_.Sub("hold.out")), "HOLDING");
          return !held.is_discarded() || !holder.running();
        },
        30s);
    EXPECT_FALSE(held.is_discarded())
        << "no HOLDING line within 30 s; holder: "
        << holder.last_exit().value_or(ExitInfo{}).ToString() << "\nstderr:\n"
        << ReadFileOrEmpty(dir_.Sub("hold.err"));
    return held;
  }

  void TearDown() override {
    if (HasFailure()) {
      std::fprintf(stderr, "--- kvtierd log (%s) ---\n%s\n", dir_.Sub("kvtierd.log").c_str(),
                   ReadFileOrEmpty(dir_.Sub("kvtierd.log")).c_str());
    }
  }

  TempDir dir_{"kvtier-it"};
  std::string socket_;
};

}  // namespace kvtier::integration
