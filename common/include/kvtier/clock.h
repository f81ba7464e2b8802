// Clock: the time source of everything that expires (leases, reservations).
// Production uses SteadyClock; tests use a clock they advance by hand
// (tests/testing/manual_clock.h).
#pragma once

#include <chrono>

namespace kvtier {

class Clock {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  virtual ~Clock() = default;
  // Thread-safe.
  virtual TimePoint Now() const = 0;
};

class SteadyClock final : public Clock {
 public:
  TimePoint Now() const override { return std::chrono::steady_clock::now(); }
  // A process-wide instance.
  static const SteadyClock& Instance() {
    static const SteadyClock clock;
    return clock;
  }
};

}  // namespace kvtier
