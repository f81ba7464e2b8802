// Request traces in the Mooncake FAST'25 format (one JSON object a line:
// `timestamp` ms, `input_length` and `output_length` tokens, `hash_ids`: one id
// per 512-token block of the prompt, equal ids = equal prefix up to that block).
#pragma once

#include <cstdint>
#include <istream>
#include <string>
#include <vector>

#include "kvtier/status.h"

namespace kvtier::tools {

// Longest prompt a trace line may hold: kvtierd's default limit (4M tokens).
inline constexpr uint64_t kMaxTraceInputTokens = uint64_t{1} << 22;

struct TraceRequest {
  double timestamp_ms = 0;
  uint64_t input_length = 0;   // prompt tokens
  uint64_t output_length = 0;  // generated tokens (not replayed)
  std::vector<uint64_t> hash_ids;
};

// Reads at most `limit` requests (0 = all). Errors: NOT_FOUND for a missing
// file; INVALID_ARGUMENT "FILE:LINE: ..." for a malformed line (bad JSON, a
// missing or mistyped field, a negative length, a prompt longer than
// kMaxTraceInputTokens, a hash_ids count that is not ceil(input_length / 512)).
Result<std::vector<TraceRequest>> LoadMooncakeTrace(const std::string& path, uint64_t limit);
// The same over a stream; `path` names it in the messages.
Result<std::vector<TraceRequest>> ParseMooncakeTrace(std::istream& in, const std::string& path,
                                                     uint64_t limit);

// A built-in multi-turn chat workload in the same format, for machines without
// the real trace: conversations share a system prompt, and each turn's prompt
// is the previous turn's prompt plus new blocks. Deterministic for a `seed`.
std::vector<TraceRequest> GenerateMultiTurnTrace(uint64_t num_requests, uint64_t seed);

}  // namespace kvtier::tools
