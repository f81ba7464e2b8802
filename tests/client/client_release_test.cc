// Lease releases of the client SDK against a real kvtierd: Load releases its
// lease in the background, and those releases must keep up with loads from
// many threads of one Client, or the leases waiting for them keep their chunks
// pinned and later loads find no room to promote into (found by the crash
// loop, issue 10: a read-back served 52 chunks fewer than the index held,
// with no error and no fail-open).
#include <atomic>
#include <nlohmann/json.hpp>
#include <thread>

#include "gtest/gtest.h"
#include "kvtier/client.h"
#include "kvtier/tools/model_presets.h"
#include "kvtier/tools/synthetic_kv.h"
#include "testing/daemon_process.h"
#include "testing/nvme_dir.h"

namespace kvtier {
namespace {

using testing::DaemonProcess;
using testing::TempDir;
using namespace std::chrono_literals;

constexpr uint32_t kChunkTokens = 32;  // tiny: 16 KiB payloads in 20 KiB slots
constexpr size_t kPromptChunks = 16;
constexpr int kPrompts = 48;  // 768 chunks: most of them only on NVMe
// Each thread holds at most one lease of 16 chunks and has at most one more
// on its way back: 6 * 2 * 16 = 192 of the 204 slots.
constexpr int kThreads = 6;
constexpr int kLoadsPerThread = 400;

std::vector<int32_t> Prompt(int p) {
  std::vector<int32_t> t(kPromptChunks * kChunkTokens);
  for (size_t i = 0; i < t.size(); ++i) {
    t[i] = static_cast<int32_t>((static_cast<uint64_t>(p) * 2654435761u + i * 40503u) % 128000);
  }
  return t;
}

TEST(ClientRelease, LoadsFromManyThreadsOfOneClientNeverPinTheArenaThroughQueuedReleases) {
  TempDir dir("kvtier-client-release");
  testing::NvmeDir nvme("client-release");
  DaemonProcess::Options o;
  o.socket_path = dir.Sub("kvtierd.sock");
  o.dram_bytes = "4MiB";  // 204 slots of 20 KiB
  // One client may hold the whole arena: this is about releases, not the per-session limit.
  o.extra_args = {"--nvme-path", nvme.path(),           "--nvme-bytes",
                  "64MiB",       "--session-max-bytes", o.dram_bytes};
  o.log_path = dir.Sub("kvtierd.log");
  DaemonProcess daemon(o);
  ASSERT_EQ(daemon.Start(), "");

  ClientOptions co;
  co.socket_path = o.socket_path;
  co.deadline = 5000ms;
  auto client = Client::Connect(co);
  ASSERT_TRUE(client.ok() && (*client)->connected());
  auto spec = tools::ModelPreset("tiny", kChunkTokens);
  ASSERT_TRUE(spec.ok());
  auto ns = (*client)->OpenNamespace(*spec);
  ASSERT_TRUE(ns.ok());
  for (int p = 0; p < kPrompts; ++p) {
    const auto tokens = Prompt(p);
    const auto keys = Client::ChunkKeys(*ns, tokens);
    auto st = (*client)->Store(*ns, tokens, [&](size_t i, std::span<std::byte> payload) {
      tools::FillPayload(keys[i], spec->num_layers, payload);
      return Status::Ok();
    });
    ASSERT_TRUE(st.ok() && st->fail_open.ok());
    ASSERT_EQ(st->stored_chunks, kPromptChunks);
    // Written through before DRAM needs the room (the writer may lag the stores).
    for (auto until = std::chrono::steady_clock::now() + 10s;
         std::chrono::steady_clock::now() < until; std::this_thread::sleep_for(5ms)) {
      auto r = daemon.Ctl({"--json", "stats"});
      const auto s = nlohmann::json::parse(r.out, nullptr, false);
      if (!s.is_discarded() && s["tiers"][1]["pending_writes"] == 0) break;
    }
  }

  std::atomic<int> short_loads{0}, loads{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::byte> buffer(kPromptChunks * ns->layout.payload_bytes);
      for (int i = 0; i < kLoadsPerThread; ++i) {
        const int p = (t * 7 + i * 5) % kPrompts;
        auto load = (*client)->Load(*ns, Prompt(p), buffer);
        ++loads;
        if (!load.ok() || !load->fail_open.ok() || load->num_chunks != kPromptChunks) {
          ++short_loads;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  // Every prompt is on NVMe and the leases (held, or released and on their
  // way) fit in the arena: each load gets its whole prompt.
  EXPECT_EQ(short_loads.load(), 0) << "of " << loads.load() << " loads";
}

}  // namespace
}  // namespace kvtier
