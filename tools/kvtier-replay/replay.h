// kvtier-replay's per-request work and its totals, shared by the closed-loop
// replay, the sweep (sweep.h) and the open-loop replay at trace times (rate.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvtier/client.h"
#include "kvtier/tools/trace.h"
#include "progress.h"

namespace kvtier::replay {

struct ReplayOptions {
  std::string socket_path;  // "": the daemon's default
  std::string model = "tiny";
  uint32_t chunk_tokens = 256;
  std::chrono::milliseconds deadline{100};  // per RPC
  std::string prefetch = "off";             // off, best_effort, wait_complete, timeout
  int64_t schedule_delay_ms = 0;            // from a request's prefetch to its load
};

// What requests added up to. Latencies in microseconds, one sample a call.
struct Totals {
  uint64_t requests = 0, prompt_tokens = 0, hit_tokens = 0, bytes_loaded = 0, bytes_stored = 0;
  uint64_t chunks_loaded = 0, chunks_stored = 0, chunks_dropped = 0, verify_errors = 0;
  uint64_t fail_open = 0;
  uint64_t nvme_hit_tokens = 0, nvme_bytes_loaded = 0;
  uint64_t remote_hit_tokens = 0, remote_bytes_loaded = 0;  // not in nvme_*
  uint64_t prefetch_nvme_chunks = 0;   // NVMe chunks the prefetches set out to promote
  uint64_t prefetch_ready_chunks = 0;  // of those, ready in DRAM when the load came
  std::vector<double> lookup_us, load_us, store_us;
  std::vector<double> start_lag_us;  // at trace times: from a request's arrival to its start

  double HitRate() const {
    return prompt_tokens == 0 ? 0.0 : static_cast<double>(hit_tokens) / prompt_tokens;
  }
  void Add(const Totals& o);
};

// One SDK client (its own session) with the namespace of the model open; runs
// requests one at a time: Prefetch (if asked), Load and verify in place inside
// the lease, Store the missing full chunks.
//
// Thread-safety: not thread-safe; one per thread.
class RequestRunner {
 public:
  // Connects and opens the namespace. On failure prints "kvtier-replay: ..."
  // to stderr, sets *exit_code (1: kvtierd unreachable; 2: the model or
  // namespace refused) and returns null.
  static std::unique_ptr<RequestRunner> Create(const ReplayOptions& options, int* exit_code);

  // Runs `req` under `request_id` (unique per daemon), adding to `t`. false
  // (with the message printed) when a call failed.
  bool Run(const tools::TraceRequest& req, const std::string& request_id, Totals& t);
  // The chunk keys of `req`'s prompt in this runner's namespace (what Run looks up).
  std::vector<ChunkKey> ChunkKeysOf(const tools::TraceRequest& req) const;

 private:
  RequestRunner(const ReplayOptions& options, std::unique_ptr<Client> client, NamespaceHandle ns,
                uint32_t num_layers);

  const ReplayOptions options_;
  std::unique_ptr<Client> client_;
  const NamespaceHandle ns_;
  const uint32_t num_layers_;
  PrefetchOptions prefetch_;
  std::vector<uint64_t> chunk_errors_;
};

// A prefix for request ids unique to this process and run.
std::string NewRunId();

// The closed loop: every request of `trace` in order on one runner. Returns 0,
// or the exit code of the failure (printed).
int ReplayClosedLoop(const ReplayOptions& options, std::span<const tools::TraceRequest> trace,
                     Progress& progress, Totals& t);

}  // namespace kvtier::replay
