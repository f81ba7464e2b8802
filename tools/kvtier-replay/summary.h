// kvtier-replay's results: the JSON summary and the table.
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "replay.h"

namespace kvtier::replay {

// What a summary says beside the totals.
struct RunInfo {
  std::string trace;  // the trace's path, or the generator's name
  std::string model;
  uint32_t chunk_tokens = 0;
  std::string prefetch;
  int64_t schedule_delay_ms = 0;
  nlohmann::json nvme_bytes_read, nvme_bytes_written;  // null: unknown
  double wall_s = 0;
  uint32_t clients = 0;  // at trace times: concurrent clients; 0: the closed loop
  double speedup = 1;    // at trace times: how much faster than the trace's clock
};

// The JSON summary (fields in README's kvtier-replay section).
nlohmann::json SummaryJson(const Totals& t, const RunInfo& info);

// The table, titled "kvtier-replay summary (...)", onto `out`.
void PrintSummary(FILE* out, const Totals& t, const RunInfo& info);

}  // namespace kvtier::replay
