// A progress line with ETA for long replays, on stderr only (results go to stdout).
//
// Thread-safety: Update may be called from several threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace kvtier::replay {

class Progress {
 public:
  // `enabled` false: prints nothing. `label` prefixes the line ("" for none).
  Progress(uint64_t total, bool enabled, std::string label);
  // `done` of `total` requests finished; `hit_rate` so far. Redraws at most
  // twice a second, and always for the last request.
  void Update(uint64_t done, double hit_rate);
  // Ends the line (a newline) if anything was drawn.
  void Finish();

  // "1m05s", "42s", "2h03m".
  static std::string FormatSeconds(double s);

 private:
  const uint64_t total_;
  const bool enabled_;
  const std::string label_;
  const std::chrono::steady_clock::time_point start_;
  std::mutex mu_;
  std::chrono::steady_clock::time_point last_;  // REQUIRES: mu_ held
  bool drawn_ = false;                          // REQUIRES: mu_ held
};

}  // namespace kvtier::replay
