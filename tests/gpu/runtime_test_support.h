// Shared by the gpu runtime tests: an independent reference of the fill pattern, a gate
// that holds a stream, and the backend-parameterized fixture.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kvtier/gpu/runtime.h"

namespace kvtier::gpu::testing {

// The Runtime::LaunchFill pattern, written as a sequential SplitMix64 generator (state
// advanced by the golden gamma, then the Stafford variant-13 finalizer; Steele et al.,
// OOPSLA 2014) with its output words serialized little-endian: independent of the
// indexed form the library uses.
inline std::vector<uint8_t> ReferencePattern(uint64_t seed, size_t bytes) {
  std::vector<uint8_t> out;
  out.reserve(bytes);
  uint64_t state = seed;
  while (out.size() < bytes) {
    state += 0x9E3779B97F4A7C15ull;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    for (int b = 0; b < 8 && out.size() < bytes; ++b) out.push_back(uint8_t(z >> (8 * b)));
  }
  return out;
}

// Holds a stream at a host function until Open(). The host function shares the state, so
// it stays valid if the Gate is destroyed first; the destructor opens the gate so that a
// failed assertion never leaves a stream blocked forever. Thread-safe.
class Gate {
 public:
  Gate() : state_(std::make_shared<State>()) {}
  ~Gate() { Open(); }
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;

  // A host function for Runtime::LaunchHostFunc that blocks until Open().
  std::function<void()> Waiter() const {
    return [state = state_] {
      std::unique_lock<std::mutex> lock(state->mu);
      state->cv.wait(lock, [&] { return state->open; });
    };
  }
  // Opens the gate; returns the time just before the waiters were released.
  std::chrono::steady_clock::time_point Open() {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (!state_->open) {
      state_->opened_at = std::chrono::steady_clock::now();
      state_->open = true;
      state_->cv.notify_all();
    }
    return state_->opened_at;
  }

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool open = false;
    std::chrono::steady_clock::time_point opened_at;
  };
  std::shared_ptr<State> state_;
};

#define KVTIER_ASSERT_GPU_OK(expr)                       \
  do {                                                   \
    const ::kvtier::gpu::GpuStatus _s = (expr);          \
    ASSERT_TRUE(_s.ok()) << #expr ": " << _s.ToString(); \
  } while (0)

// Behaviour every backend must show (runtime_behaviour_test.cc). The host executable
// instantiates it for Backend::kHost; the gpu executable for Backend::kCuda, skipping when
// Runtime::CreateCuda fails (no GPU).
class RuntimeBehaviourTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (GetParam() == Backend::kHost) {
      runtime_ = Runtime::CreateHost();
      return;
    }
    const GpuStatus s = Runtime::CreateCuda(0, &runtime_);
    if (!s.ok()) GTEST_SKIP() << "no usable GPU: " << s.ToString();
  }

  std::unique_ptr<Runtime> runtime_;
};

inline std::string BackendName(const ::testing::TestParamInfo<Backend>& info) {
  return info.param == Backend::kHost ? "host" : "cuda";
}

}  // namespace kvtier::gpu::testing
