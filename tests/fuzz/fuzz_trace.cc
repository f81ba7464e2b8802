// Fuzz target: the Mooncake trace parser of kvtier-replay and kvtier-bench
// (kvtier/tools/trace.h, ParseMooncakeTrace) and the prompts it feeds (SynthesizePrompt).
//
// Input: the first byte is a request limit (0..15; 0 = all), the rest the trace's text.
// Checks, besides ASan/UBSan:
//   - an error is INVALID_ARGUMENT naming "<name>:<line>: ";
//   - every request read holds what the format promises: input_length at most
//     kMaxTraceInputTokens and ceil(input_length / 512) hash ids, and its synthesized prompt
//     has input_length tokens, each in [0, 128000);
//   - a parse with the limit returns the first requests of a parse without it (or, when that
//     one failed, succeeds only if the limit was reached before the bad line).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>

#include "fuzz_check.h"
#include "kvtier/tools/synthetic_kv.h"
#include "kvtier/tools/trace.h"

namespace {

using kvtier::tools::TraceRequest;

bool SameRequest(const TraceRequest& a, const TraceRequest& b) {
  return a.timestamp_ms == b.timestamp_ms && a.input_length == b.input_length &&
         a.output_length == b.output_length && a.hash_ids == b.hash_ids;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint64_t limit = data[0] % 16;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  std::istringstream all_in(text);
  const auto all = kvtier::tools::ParseMooncakeTrace(all_in, "fuzz.jsonl", 0);
  std::istringstream limited_in(text);
  const auto limited = kvtier::tools::ParseMooncakeTrace(limited_in, "fuzz.jsonl", limit);

  if (!all.ok()) {
    FUZZ_CHECK(all.status().code() == kvtier::StatusCode::kInvalidArgument,
               "a malformed trace is not INVALID_ARGUMENT");
    FUZZ_CHECK(all.status().message().rfind("fuzz.jsonl:", 0) == 0,
               "the error does not name the file and line");
    if (limited.ok()) {
      FUZZ_CHECK(limit != 0 && limited->size() == limit,
                 "a limited parse succeeded before reaching the bad line");
    }
    return 0;
  }
  FUZZ_CHECK(limited.ok(), "a limited parse of a good trace failed");
  const size_t expect = limit == 0 ? all->size() : std::min<size_t>(limit, all->size());
  FUZZ_CHECK(limited->size() == expect, "the limited parse returned a wrong count");
  for (size_t i = 0; i < limited->size(); ++i) {
    FUZZ_CHECK(SameRequest((*limited)[i], (*all)[i]), "the limited parse differs");
  }
  for (const TraceRequest& r : *all) {
    FUZZ_CHECK(r.input_length <= kvtier::tools::kMaxTraceInputTokens,
               "a request is longer than the limit");
    const uint64_t blocks =
        (r.input_length + kvtier::tools::kTraceBlockTokens - 1) / kvtier::tools::kTraceBlockTokens;
    FUZZ_CHECK(r.hash_ids.size() == blocks, "hash_ids does not cover input_length");
    if (r.input_length > (uint64_t{1} << 16)) continue;  // keeps each run fast
    const std::vector<int32_t> prompt = kvtier::tools::SynthesizePrompt(r.hash_ids, r.input_length);
    FUZZ_CHECK(prompt.size() == r.input_length, "the prompt has another length");
    for (int32_t t : prompt) FUZZ_CHECK(t >= 0 && t < 128000, "a token is outside the vocabulary");
  }
  return 0;
}
