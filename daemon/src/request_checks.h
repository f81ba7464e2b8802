// Checks shared by CacheCore's request handlers (cache_core.cc, cache_core_nvme.cc).
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/daemon/core_namespace.h"
#include "kvtier/status.h"

namespace kvtier::request_checks {

// The prompt of a Lookup or Prefetch, viewed in place. REQUIRES: `raw` is
// aligned for int32 (core_calls.h; protobuf and ring strings are).
// Errors: INVALID_ARGUMENT naming `tokens`.
inline Result<std::span<const int32_t>> PromptTokens(std::string_view raw, uint64_t max_tokens) {
  if (raw.size() % 4 != 0) {
    return Status::InvalidArgument("tokens is " + std::to_string(raw.size()) +
                                   " bytes, not a multiple of 4 (packed int32)");
  }
  if (raw.size() / 4 > max_tokens) {
    return Status::InvalidArgument("tokens holds " + std::to_string(raw.size() / 4) +
                                   " ids, more than the limit of " + std::to_string(max_tokens));
  }
  return std::span<const int32_t>(reinterpret_cast<const int32_t*>(raw.data()), raw.size() / 4);
}

// The chunk keys of `tokens` (a prompt prefix) in namespace `id`, which must be
// open here (`live`, nullptr when it is not). `instead`: what the caller can
// do without tokens, for the error. Errors: NOT_FOUND (not open),
// INVALID_ARGUMENT (less than one chunk of tokens).
inline Result<std::vector<ChunkKey>> PromptKeys(const CoreNamespace* live, const NamespaceId& id,
                                                std::span<const int32_t> tokens,
                                                const std::string& instead) {
  if (live == nullptr) {
    return Status::NotFound(
        "namespace_id " + id.ToHex() +
        " is not open in this daemon, so its tokens cannot be keyed: " + instead);
  }
  std::vector<ChunkKey> keys = live->spec.ChunkKeys(live->id, tokens);
  if (keys.empty()) {
    return Status::InvalidArgument("tokens hold " + std::to_string(tokens.size()) +
                                   " ids, less than one chunk of " +
                                   std::to_string(live->spec.chunk_tokens));
  }
  return keys;
}

}  // namespace kvtier::request_checks
