#include "progress.h"

#include <cstdio>

namespace kvtier::replay {

Progress::Progress(uint64_t total, bool enabled, std::string label)
    : total_(total),
      enabled_(enabled),
      label_(std::move(label)),
      start_(std::chrono::steady_clock::now()),
      last_(start_) {}

std::string Progress::FormatSeconds(double s) {
  const uint64_t t = s < 0 ? 0 : static_cast<uint64_t>(s + 0.5);
  char buf[32];
  if (t >= 3600) {
    std::snprintf(buf, sizeof buf, "%lluh%02llum", static_cast<unsigned long long>(t / 3600),
                  static_cast<unsigned long long>(t % 3600 / 60));
  } else if (t >= 60) {
    std::snprintf(buf, sizeof buf, "%llum%02llus", static_cast<unsigned long long>(t / 60),
                  static_cast<unsigned long long>(t % 60));
  } else {
    std::snprintf(buf, sizeof buf, "%llus", static_cast<unsigned long long>(t));
  }
  return buf;
}

void Progress::Update(uint64_t done, double hit_rate) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard lock(mu_);
  if (done < total_ && now - last_ < std::chrono::milliseconds(500)) return;
  last_ = now;
  drawn_ = true;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double frac = total_ == 0 ? 1.0 : static_cast<double>(done) / total_;
  const std::string eta = done == 0 ? "?" : FormatSeconds(elapsed * (1 - frac) / frac);
  std::fprintf(stderr, "\r%s[%llu/%llu] %5.1f%%  hit rate %.4f  elapsed %s  ETA %s   ",
               label_.empty() ? "" : (label_ + " ").c_str(), static_cast<unsigned long long>(done),
               static_cast<unsigned long long>(total_), 100 * frac, hit_rate,
               FormatSeconds(elapsed).c_str(), eta.c_str());
  std::fflush(stderr);
}

void Progress::Finish() {
  std::lock_guard lock(mu_);
  if (drawn_) std::fprintf(stderr, "\n");
  drawn_ = false;
}

}  // namespace kvtier::replay
