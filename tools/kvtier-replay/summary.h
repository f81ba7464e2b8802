// kvtier-replay's results: the JSON summary and the table.
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "kvtier/admin_client.h"
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

// The NVMe tier's read and written bytes from `admin`'s Stats: {0, 0} without
// an NVMe tier; nullopt when `admin` is null or Stats fails.
using NvmeBytes = std::optional<std::pair<uint64_t, uint64_t>>;
NvmeBytes NvmeCounters(AdminClient* admin);
// Sets info.nvme_bytes_read/written from two samples (unset unless both are
// known and neither went back, as after a daemon restart).
void SetNvmeBytes(const NvmeBytes& before, const NvmeBytes& after, RunInfo& info);

// `j` to `path` ("-": stdout; "": nowhere). 0, or 1 (printed) when it cannot be written.
int WriteJson(const std::string& path, const nlohmann::json& j);

}  // namespace kvtier::replay
