// Logging setup: kvtier logs through spdlog's default logger.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "kvtier/status.h"

namespace kvtier {

// Makes spdlog's default logger one named `name` that writes to stderr (spdlog's
// own default writes to stdout, where a tool's results go). Every kvtier binary
// and the Python module call it first; a C++ engine embedding the SDK may set
// its own default logger instead. Idempotent.
void LogToStderr(const std::string& name);

// INVALID_ARGUMENT unless `level` is one of spdlog's names (trace .. off).
Status CheckLogLevel(std::string_view level);
// Sets the default logger's level from "trace", "debug", "info", "warn",
// "error", "critical" or "off". Errors: INVALID_ARGUMENT naming the level.
Status SetLogLevel(std::string_view level);

// Rate limit for a warning that a client or a bad disk can repeat at will:
// one message per `every`, counting those held back. Thread-safe.
//
//   if (auto held_back = limiter.Admit()) {
//     spdlog::warn("token check failed ...{}", HeldBack(*held_back));
//   }
class LogLimiter {
 public:
  explicit LogLimiter(std::chrono::milliseconds every = std::chrono::seconds(10)) : every_(every) {}
  // When this message may be logged: how many were held back since the last
  // one; nullopt when it must not be.
  std::optional<uint64_t> Admit();

 private:
  const std::chrono::milliseconds every_;
  std::mutex mu_;
  std::chrono::steady_clock::time_point last_{};  // GUARDED_BY(mu_)
  bool logged_ = false;                           // GUARDED_BY(mu_)
  uint64_t held_back_ = 0;                        // GUARDED_BY(mu_)
};

// " (N more like it since the last warning)", or "" for 0.
std::string HeldBack(uint64_t n);

}  // namespace kvtier
