#include "kvtier/latency_histogram.h"

#include <algorithm>

namespace kvtier {
namespace {

// kBounds in whole nanoseconds, so that a duration equal to a bound lands in its bucket.
constexpr std::array<int64_t, LatencyHistogram::kBounds.size()> BoundsNs() {
  std::array<int64_t, LatencyHistogram::kBounds.size()> ns{};
  for (size_t i = 0; i < ns.size(); ++i) {
    ns[i] = static_cast<int64_t>(LatencyHistogram::kBounds[i] * 1e9 + 0.5);
  }
  return ns;
}
constexpr auto kBoundsNs = BoundsNs();

}  // namespace

void LatencyHistogram::Observe(std::chrono::nanoseconds d) {
  const int64_t ns = std::max<int64_t>(0, d.count());
  const size_t bucket = static_cast<size_t>(
      std::lower_bound(kBoundsNs.begin(), kBoundsNs.end(), ns) - kBoundsNs.begin());
  counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(static_cast<uint64_t>(ns), std::memory_order_relaxed);
}

LatencyHistogram::Snapshot LatencyHistogram::Read() const {
  Snapshot s;
  for (size_t i = 0; i < kBuckets; ++i) {
    s.counts[i] = counts_[i].load(std::memory_order_relaxed);
    s.count += s.counts[i];
  }
  s.sum_seconds = static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) * 1e-9;
  return s;
}

}  // namespace kvtier
