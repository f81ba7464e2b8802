// kvtier-bench scale: do concurrent clients scale? Each client is its own
// session (its own Client, thread, namespace and cached prompt) sending
// Lookups of a 2K-token prompt back to back for `seconds`. First one client
// alone (the baseline, in the same run), then `clients` at once; over the
// control ring, then over gRPC. Prints lookups/s, p50 and p99 of each, and
// the ratios (issue 11's goal: aggregate lookups/s >= 1.7x with p99 <= 2x
// the single client's).
#pragma once

#include <cstdint>
#include <string>

namespace kvtier::bench {

// Exit status: 0, or 1 when a Lookup failed or missed (exits via Die).
int RunScale(const std::string& socket, int clients, double seconds, uint64_t prompt_tokens);

}  // namespace kvtier::bench
