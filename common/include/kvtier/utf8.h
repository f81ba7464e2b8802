// UTF-8 validation for the text fields of requests (protobuf strings must be
// UTF-8: over gRPC kvtierd could not even parse one that is not).
#pragma once

#include <cstddef>
#include <string_view>

namespace kvtier {

// Offset of the first byte of `s` that does not begin (or continue) a
// well-formed UTF-8 sequence (RFC 3629: no overlong forms, no surrogates,
// nothing past U+10FFFF), or s.size() when it is all UTF-8.
size_t FirstNonUtf8Byte(std::string_view s);

}  // namespace kvtier
