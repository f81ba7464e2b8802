// ManualClock: a Clock the test advances by hand (never linked into production).
#pragma once

#include <atomic>
#include <chrono>

#include "kvtier/clock.h"

namespace kvtier::testing {

class ManualClock final : public Clock {
 public:
  TimePoint Now() const override { return TimePoint(std::chrono::nanoseconds(now_ns_.load())); }
  void Advance(std::chrono::nanoseconds d) { now_ns_.fetch_add(d.count()); }

 private:
  std::atomic<int64_t> now_ns_{1'000'000'000};
};

}  // namespace kvtier::testing
