#include "rate.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <thread>

namespace kvtier::replay {

int ReplayAtTraceTimes(const ReplayOptions& options, const RateOptions& rate,
                       std::span<const tools::TraceRequest> trace, Progress& progress, Totals& t) {
  using Clock = std::chrono::steady_clock;
  std::vector<std::unique_ptr<RequestRunner>> runners;
  for (uint32_t c = 0; c < rate.clients; ++c) {
    int exit_code = 0;
    runners.push_back(RequestRunner::Create(options, &exit_code));
    if (!runners.back()) return exit_code;
  }
  const std::string run_id = NewRunId();
  const double t0_ms = trace.empty() ? 0 : trace.front().timestamp_ms;
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::atomic<uint64_t> done{0}, prompt_tokens{0}, hit_tokens{0};
  std::mutex mu;  // guards t
  const auto start = Clock::now();
  const auto client = [&](RequestRunner& runner) {
    Totals mine;
    for (size_t i = next++; i < trace.size() && !failed; i = next++) {
      const double offset_ms = (trace[i].timestamp_ms - t0_ms) / rate.speedup;
      const auto due = start + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double, std::milli>(offset_ms));
      std::this_thread::sleep_until(due);
      mine.start_lag_us.push_back(
          std::chrono::duration<double, std::micro>(Clock::now() - due).count());
      const uint64_t hit_before = mine.hit_tokens;
      if (!runner.Run(trace[i], run_id + std::to_string(i), mine)) {
        failed = true;
        break;
      }
      hit_tokens += mine.hit_tokens - hit_before;
      prompt_tokens += trace[i].input_length;
      const uint64_t d = ++done;
      progress.Update(d, static_cast<double>(hit_tokens) / std::max<uint64_t>(prompt_tokens, 1));
    }
    std::lock_guard lock(mu);
    t.Add(mine);
  };
  std::vector<std::thread> threads;
  for (auto& r : runners) threads.emplace_back(client, std::ref(*r));
  for (auto& th : threads) th.join();
  progress.Finish();
  return failed ? 1 : 0;
}

}  // namespace kvtier::replay
