// LatencyHistogram: counts of durations in fixed buckets (5 us to 10 s, and
// over), their sum and count, for kvtierd's Prometheus histograms
// (kvtier_*_seconds). Observe is a few relaxed atomic adds: it may be called
// on any thread, under any lock.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>

namespace kvtier {

class LatencyHistogram {
 public:
  // Upper bounds of the buckets, in seconds (a duration d lands in the first
  // bucket with d <= bound; past the last, in the overflow bucket, +Inf).
  static constexpr std::array<double, 20> kBounds = {
      5e-6, 1e-5,   2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3,
      1e-2, 2.5e-2, 5e-2,   0.1,  0.25, 0.5,    1,    2.5,  5,      10};
  static constexpr size_t kBuckets = kBounds.size() + 1;  // the last is +Inf

  struct Snapshot {
    std::array<uint64_t, kBuckets> counts{};  // per bucket, not cumulative
    uint64_t count = 0;                       // sum of counts
    double sum_seconds = 0;
  };

  // A negative duration (a clock stepped back) counts as 0.
  void Observe(std::chrono::nanoseconds d);
  // The counts as of now (each field read atomically, not all at one instant).
  Snapshot Read() const;

 private:
  std::array<std::atomic<uint64_t>, kBuckets> counts_{};
  std::atomic<uint64_t> sum_ns_{0};
};

// Observes the time from its construction to its destruction.
class LatencyTimer {
 public:
  explicit LatencyTimer(LatencyHistogram& h) : h_(h), start_(std::chrono::steady_clock::now()) {}
  ~LatencyTimer() { h_.Observe(std::chrono::steady_clock::now() - start_); }
  LatencyTimer(const LatencyTimer&) = delete;
  LatencyTimer& operator=(const LatencyTimer&) = delete;

 private:
  LatencyHistogram& h_;
  const std::chrono::steady_clock::time_point start_;
};

}  // namespace kvtier
