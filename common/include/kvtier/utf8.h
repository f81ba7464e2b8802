// UTF-8 validation for the text fields of requests (protobuf strings must be
// UTF-8: over gRPC kvtierd could not even parse one that is not).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace kvtier {

// Offset of the first byte of `s` that does not begin (or continue) a
// well-formed UTF-8 sequence (RFC 3629: no overlong forms, no surrogates,
// nothing past U+10FFFF), or s.size() when it is all UTF-8.
size_t FirstNonUtf8Byte(std::string_view s);

// For UTF-8 text: "" when it holds no control character (Unicode's Cc: C0,
// DEL, C1), else " holds control character U+XXXX (byte N)" for the first one,
// to follow the field's name in an error. A NUL would cut a name short in C
// strings, a newline would forge log lines.
std::string ControlCharacterIn(std::string_view s);

}  // namespace kvtier
