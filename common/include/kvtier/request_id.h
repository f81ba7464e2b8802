// The engine request id a Lookup or Prefetch may carry (LookupRequest.request_id):
// the daemon counts the token hit rate once per request under it.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "kvtier/status.h"

namespace kvtier {

// Longest request id, in bytes (vLLM's are about 45, SGLang's 32).
inline constexpr size_t kMaxRequestIdBytes = 256;

// Errors: INVALID_ARGUMENT naming request_id when it is too long.
inline Status CheckRequestId(std::string_view request_id) {
  if (request_id.size() <= kMaxRequestIdBytes) return Status::Ok();
  return Status::InvalidArgument("request_id is " + std::to_string(request_id.size()) +
                                 " bytes, more than " + std::to_string(kMaxRequestIdBytes));
}

}  // namespace kvtier
