// Parsers of the Redis answers RedisCluster routes by (CLUSTER SLOTS, MOVED,
// ASK), private to it. Every function checks each type, count and range, so a
// wrong or hostile answer gives an error, never a crash or a wrong route.
//
// Thread-safety: pure functions.
#pragma once

#include <hiredis/hiredis.h>

#include <cstdint>
#include <string_view>
#include <vector>

#include "kvtier/status.h"
#include "kvtier/tiers/redis_cluster.h"

namespace kvtier::redis {

inline constexpr uint32_t kNumSlots = 16384;

// Slots first..last (inclusive) served by `master`.
struct SlotRange {
  uint16_t first = 0;
  uint16_t last = 0;
  RedisEndpoint master;
};

// A CLUSTER SLOTS answer from `from` (whose host stands in for an empty or "?"
// host in it). Errors: INVALID_ARGUMENT saying what is wrong.
Result<std::vector<SlotRange>> ParseClusterSlots(const redisReply& reply,
                                                 const RedisEndpoint& from);

// A MOVED or ASK error answer: "MOVED <slot> <host>:<port>".
struct Redirect {
  bool ask = false;  // ASK; else MOVED
  uint16_t slot = 0;
  RedisEndpoint target;
};
// True when `error` starts with "MOVED " or "ASK ".
bool IsRedirect(std::string_view error);
// Parses a redirect from `from` (whose host stands in for an empty one).
// Errors: INVALID_ARGUMENT saying what is wrong.
Result<Redirect> ParseRedirect(std::string_view error, const RedisEndpoint& from);

// True when a CLUSTER SLOTS error answer says the server is not a cluster
// ("cluster support disabled", or an unknown CLUSTER command).
bool IsClusterDisabled(std::string_view error);

// "host:port" with the port after the last ':' (so the host may be an IPv6
// address without brackets). Errors: INVALID_ARGUMENT saying what is wrong.
Result<RedisEndpoint> ParseHostPort(std::string_view text);

// A decimal port in 1..65535. Errors: INVALID_ARGUMENT naming the text.
Result<uint16_t> ParsePort(std::string_view text);

}  // namespace kvtier::redis
