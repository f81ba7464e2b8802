// The load test (issue 10's campaign): 32 concurrent clients (kvtier_test_client
// load: threads with a session each) over four namespaces of four slot sizes,
// doing lookups, loads (every byte checked), stores and prefetches followed by
// their loads, against a small arena (64 MiB) with an NVMe tier (1 GiB,
// write-through). Asserts 0 API errors, 0 fail-opens and 0 wrong bytes, and
// that kvtierd's resident memory stays within its configuration + 10%;
// reports throughput and latency per call.
//
// The memory kvtierd is configured to use: the DRAM arena (shared memory,
// resident once touched), RocksDB's memtables (two of 16 MiB at most), and what
// it holds before any client connects (code and libraries, mostly shared with
// other processes, and its threads' stacks), measured at start. The limit is
// 110% of their sum.
//
// Duration: $KVTIER_LOAD_SECONDS (default 10, what `make test` runs; `make
// soak` runs 60).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "integration/campaign_util.h"
#include "kvtier/sanitizers.h"

namespace kvtier::testing {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

constexpr uint64_t kArenaBytes = uint64_t{64} << 20;
// NvmeIndex: two memtables (2 MiB each since issue 32; 16 MiB kept as a loose bound).
constexpr uint64_t kMemtableBytes = uint64_t{2} * (16 << 20);
// The NVMe writer's two staging buffers (Destager): 1/16 of the arena each, and a slot (under 1
// MiB here).
constexpr uint64_t kStagingBytes = 2 * (kArenaBytes / 16 + (1 << 20));

// Fields of /proc/<pid>/status in bytes ("VmRSS", "RssAnon", "RssShmem", ...);
// empty when the process is gone.
std::map<std::string, uint64_t> MemoryOf(pid_t pid) {
  std::map<std::string, uint64_t> m;
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    std::istringstream ss(line);
    std::string key, unit;
    uint64_t kib = 0;
    if (ss >> key >> kib >> unit && unit == "kB" && key.back() == ':') {
      key.pop_back();
      m[key] = kib * 1024;
    }
  }
  return m;
}

TEST(LoadTest, ThirtyTwoClientsOverFourNamespacesWithoutAnErrorWithinTheMemoryBudget) {
  const uint64_t seconds = EnvCount("KVTIER_LOAD_SECONDS", 10);
  TempDir dir("kvtier-load");
  NvmeDir nvme("load-test");
  DaemonProcess::Options o;
  o.socket_path = dir.Sub("kvtierd.sock");
  o.dram_bytes = "64MiB";
  o.extra_args = {"--nvme-path", nvme.path(), "--nvme-bytes", "1GiB"};
  o.log_path = dir.Sub("kvtierd.log");
  DaemonProcess daemon(o);
  ASSERT_EQ(daemon.Start(), "");
  const uint64_t idle_rss = MemoryOf(daemon.pid())["VmRSS"];
  ASSERT_GT(idle_rss, 0u);
  const uint64_t budget = kArenaBytes + kMemtableBytes + kStagingBytes + idle_rss;

  ChildProcess load;
  std::string error;
  ASSERT_TRUE(load.Spawn({BinPath("kvtier_test_client"), "load", "--socket", o.socket_path,
                          "--clients", "32", "--namespaces", "4", "--conversations", "64",
                          "--seconds", std::to_string(seconds), "--deadline-ms", "1000"},
                         dir.Sub("load.out"), dir.Sub("load.err"), &error))
      << error;
  std::map<std::string, uint64_t> peak;  // the largest value of each field seen
  std::optional<ExitInfo> done;
  while (!(done = load.Wait(100ms))) {
    for (const auto& [k, v] : MemoryOf(daemon.pid())) peak[k] = std::max(peak[k], v);
  }
  const std::map<std::string, uint64_t> end = MemoryOf(daemon.pid());
  const std::string out = ReadFileOrEmpty(dir.Sub("load.out"));
  const std::string err = ReadFileOrEmpty(dir.Sub("load.err"));
  EXPECT_TRUE(done->exited && done->exit_code == 0) << done->ToString() << "\n" << out << err;
  const json r = TaggedJson(out, "RESULT ");
  ASSERT_TRUE(r.is_object()) << out << err;
  EXPECT_EQ(r["api_errors"], 0u) << err.substr(0, 4000);
  EXPECT_EQ(r["fail_open"], 0u) << err.substr(0, 4000);
  EXPECT_EQ(r["bad_chunks"], 0u) << "wrong bytes served";
  EXPECT_GT(r["checked_chunks"].get<uint64_t>(), 0u);
  for (const char* kind : {"lookup", "load", "store", "prefetch"}) {
    EXPECT_GT(r["per_call"][kind]["calls"].get<uint64_t>(), 0u) << kind;
  }
  ASSERT_TRUE(daemon.running()) << daemon.log();
  const json stats = StatsOf(daemon);
  const json nvme_tier = TierOf(stats, "nvme");
  EXPECT_EQ(nvme_tier["corrupt_reads"], 0u);
  EXPECT_EQ(nvme_tier["io_errors"], 0u);
  // The daemon's peak VmHWM covers what the 100 ms samples may have missed.
  const uint64_t hwm = std::max(end.count("VmHWM") ? end.at("VmHWM") : 0, peak["VmRSS"]);
#ifdef KVTIER_ASAN_ENABLED
  // kvtierd is an ASan build here too: its RSS holds ASan's shadow memory and
  // quarantine (3.2x the budget in make test-asan), so the bound means nothing.
  std::printf("RSS budget not checked under ASan: peak %llu bytes, budget %llu\n",
              static_cast<unsigned long long>(hwm), static_cast<unsigned long long>(budget));
#else
  EXPECT_LE(hwm, budget * 11 / 10)
      << "peak RSS " << hwm << " bytes: anon " << peak["RssAnon"] << ", shmem " << peak["RssShmem"]
      << ", file " << peak["RssFile"] << "; budget " << budget;
#endif

  ReportCampaign({{"campaign", "load"},
                  {"seconds", r["seconds"]},
                  {"clients", r["clients"]},
                  {"namespaces", r["namespaces"]},
                  {"calls", r["calls"]},
                  {"calls_per_s", r["calls_per_s"]},
                  {"per_call", r["per_call"]},
                  {"api_errors", r["api_errors"]},
                  {"fail_open", r["fail_open"]},
                  {"wrong_bytes", r["wrong_bytes"]},
                  {"checked_chunks", r["checked_chunks"]},
                  {"stored_chunks", r["stored_chunks"]},
                  {"dropped_chunks", r["dropped_chunks"]},
                  {"nvme_hits", nvme_tier["hits"]},
                  {"nvme_skipped_writes", nvme_tier["skipped_writes"]},
                  {"rss_idle_bytes", idle_rss},
                  {"rss_peak_bytes", hwm},
                  {"rss_peak_anon_bytes", peak["RssAnon"]},
                  {"rss_peak_shmem_bytes", peak["RssShmem"]},
                  {"rss_peak_file_bytes", peak["RssFile"]},
                  {"rss_budget_bytes", budget},
                  {"rss_over_budget", static_cast<double>(hwm) / static_cast<double>(budget)}});
}

}  // namespace
}  // namespace kvtier::testing
