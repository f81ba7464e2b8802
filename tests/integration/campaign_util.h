// Helpers shared by the campaign tests (crash loop, client death, load): the
// daemon's stats as JSON, the RESULT line of kvtier_test_client, the run's
// size from the environment, and a summary line for docs/RELIABILITY.md.
//
// Thread-safety: none needed; each test uses them from its own thread.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "testing/daemon_process.h"
#include "testing/nvme_dir.h"

namespace kvtier::testing {

// `kvtierctl --json stats` of `d`; null (and a test failure) when it fails.
inline nlohmann::json StatsOf(const DaemonProcess& d) {
  CommandResult r = d.Ctl({"--json", "stats"});
  EXPECT_TRUE(r.ok()) << r.Describe();
  nlohmann::json s = nlohmann::json::parse(r.out, nullptr, false);
  return s.is_discarded() ? nlohmann::json() : s;
}

// The row of tier `name` ("dram", "nvme") in `stats`; null when absent.
inline nlohmann::json TierOf(const nlohmann::json& stats, const std::string& name) {
  if (!stats.is_object() || !stats.contains("tiers")) return nlohmann::json();
  for (const auto& t : stats["tiers"]) {
    if (t["name"] == name) return t;
  }
  return nlohmann::json();
}

// The JSON after the last line starting with `tag` ("RESULT ", "HELD ") in
// `text`; null when there is none or it does not parse.
inline nlohmann::json TaggedJson(const std::string& text, const std::string& tag) {
  size_t at = std::string::npos;
  for (size_t p = text.find(tag); p != std::string::npos; p = text.find(tag, p + 1)) {
    if (p == 0 || text[p - 1] == '\n') at = p;
  }
  if (at == std::string::npos) return nlohmann::json();
  const size_t end = text.find('\n', at);
  const std::string body = text.substr(
      at + tag.size(), end == std::string::npos ? std::string::npos : end - at - tag.size());
  nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
  return j.is_discarded() ? nlohmann::json() : j;
}

// $name as a positive integer, else `fallback` (how long a campaign runs:
// `make test` uses the fallbacks, `make soak` sets them).
inline uint64_t EnvCount(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v, &end, 10);
  return (end != nullptr && *end == '\0' && n > 0) ? n : fallback;
}

// Median of `v` (0 when empty).
inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Prints `summary` as one line `CAMPAIGN {json}` (make soak collects them) and
// appends it to $KVTIER_CAMPAIGN_LOG when set.
inline void ReportCampaign(const nlohmann::json& summary) {
  const std::string line = "CAMPAIGN " + summary.dump();
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  if (const char* log = std::getenv("KVTIER_CAMPAIGN_LOG"); log != nullptr && *log != '\0') {
    if (std::FILE* f = std::fopen(log, "a")) {
      std::fprintf(f, "%s\n", line.c_str());
      std::fclose(f);
    }
  }
}

}  // namespace kvtier::testing
