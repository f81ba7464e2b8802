// The engine request id a Lookup or Prefetch may carry (LookupRequest.request_id):
// the daemon counts the token hit rate once per request under it.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "kvtier/status.h"
#include "kvtier/utf8.h"

namespace kvtier {

// Longest request id, in bytes (vLLM's are about 45, SGLang's 32).
inline constexpr size_t kMaxRequestIdBytes = 256;

// Errors: INVALID_ARGUMENT naming request_id when it is too long, not UTF-8
// (a protobuf string) or holds a control character.
inline Status CheckRequestId(std::string_view request_id) {
  if (request_id.size() > kMaxRequestIdBytes) {
    return Status::InvalidArgument("request_id is " + std::to_string(request_id.size()) +
                                   " bytes, more than " + std::to_string(kMaxRequestIdBytes));
  }
  if (const size_t bad = FirstNonUtf8Byte(request_id); bad != request_id.size()) {
    return Status::InvalidArgument("request_id is not UTF-8 (byte " + std::to_string(bad) + ")");
  }
  if (std::string control = ControlCharacterIn(request_id); !control.empty()) {
    return Status::InvalidArgument("request_id" + control);
  }
  return Status::Ok();
}

}  // namespace kvtier
