#include "kvtier/utf8.h"

#include <cstdio>

namespace kvtier {

size_t FirstNonUtf8Byte(std::string_view s) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char b = byte(i);
    if (b < 0x80) {
      ++i;
      continue;
    }
    // The sequence's length and the range its second byte must lie in
    // (narrower than 80..BF where overlong forms, surrogates or code points
    // past U+10FFFF would follow).
    size_t n = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
      n = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      n = 3;
      if (b == 0xE0) lo = 0xA0;
      if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      n = 4;
      if (b == 0xF0) lo = 0x90;
      if (b == 0xF4) hi = 0x8F;
    } else {
      return i;  // a continuation byte, or a lead byte UTF-8 never uses
    }
    if (i + n > s.size() || byte(i + 1) < lo || byte(i + 1) > hi) return i;
    for (size_t k = 2; k < n; ++k) {
      if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return i;
    }
    i += n;
  }
  return s.size();
}

std::string ControlCharacterIn(std::string_view s) {
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    const bool c1 = c == 0xc2 && i + 1 < s.size() &&
                    static_cast<unsigned char>(s[i + 1]) <= 0x9f;  // U+0080..U+009F
    if (c < 0x20 || c == 0x7f || c1) {
      char code[8];
      std::snprintf(code, sizeof(code), "U+%04X",
                    c1 ? static_cast<unsigned char>(s[i + 1]) : unsigned{c});
      return std::string(" holds control character ") + code + " (byte " + std::to_string(i) + ")";
    }
  }
  return "";
}

}  // namespace kvtier
