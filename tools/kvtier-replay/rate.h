// kvtier-replay --rate: the trace at its own arrival times (open loop), on N
// concurrent clients, each its own SDK client and session.
#pragma once

#include <cstdint>
#include <span>

#include "kvtier/tools/trace.h"
#include "replay.h"

namespace kvtier::replay {

struct RateOptions {
  // Concurrent clients; a request that arrives while all are busy waits for
  // the first free one (the wait shows in Totals::start_lag_us). Default: 4.
  uint32_t clients = 4;
  // The trace's clock runs this many times faster (2: half the gaps). Default: 1.
  double speedup = 1;
};

// Request i starts (trace[i].timestamp_ms - trace[0].timestamp_ms) / speedup
// after the replay's start, or later when no client is free. Returns 0, or the
// exit code of the first failure (printed; the other clients stop).
int ReplayAtTraceTimes(const ReplayOptions& options, const RateOptions& rate,
                       std::span<const tools::TraceRequest> trace, Progress& progress, Totals& t);

}  // namespace kvtier::replay
