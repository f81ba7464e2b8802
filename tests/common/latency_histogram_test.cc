#include "kvtier/latency_histogram.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace kvtier {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;
using std::chrono::seconds;

size_t BucketOf(const LatencyHistogram::Snapshot& s) {
  for (size_t i = 0; i < s.counts.size(); ++i) {
    if (s.counts[i] != 0) return i;
  }
  return s.counts.size();
}

TEST(LatencyHistogram, ADurationLandsInTheFirstBucketWhoseBoundIsAtLeastIt) {
  struct Case {
    nanoseconds d;
    size_t bucket;
  };
  // Bounds: 5 us, 10 us, 25 us, 50 us, 100 us, ... 10 s, then +Inf.
  for (const Case c : {Case{nanoseconds(0), 0}, Case{microseconds(5), 0},
                       Case{microseconds(5) + nanoseconds(1), 1}, Case{microseconds(10), 1},
                       Case{microseconds(11), 2}, Case{milliseconds(1), 7},
                       Case{milliseconds(1) + nanoseconds(1), 8}, Case{seconds(10), 19},
                       Case{seconds(11), 20}, Case{nanoseconds(-5), 0}}) {
    LatencyHistogram h;
    h.Observe(c.d);
    const LatencyHistogram::Snapshot s = h.Read();
    EXPECT_EQ(BucketOf(s), c.bucket) << c.d.count() << " ns";
    EXPECT_EQ(s.count, 1u);
  }
}

TEST(LatencyHistogram, SumAndCountAddUpAcrossThreads) {
  LatencyHistogram h;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&h] {
      for (int i = 0; i < 1000; ++i) h.Observe(microseconds(30));  // bucket 3 (<= 50 us)
    });
  }
  for (auto& t : threads) t.join();
  const LatencyHistogram::Snapshot s = h.Read();
  EXPECT_EQ(s.count, 4000u);
  EXPECT_EQ(s.counts[3], 4000u);
  EXPECT_DOUBLE_EQ(s.sum_seconds, 4000 * 30e-6);
}

TEST(LatencyHistogram, ATimerObservesItsScope) {
  LatencyHistogram h;
  {
    LatencyTimer timer(h);
    std::this_thread::sleep_for(milliseconds(2));
  }
  const LatencyHistogram::Snapshot s = h.Read();
  EXPECT_EQ(s.count, 1u);
  EXPECT_GE(s.sum_seconds, 0.002);
  EXPECT_GE(BucketOf(s), 8u);  // > 1 ms
}

}  // namespace
}  // namespace kvtier
