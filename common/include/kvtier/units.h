// Byte-size parsing and formatting, and alignment helpers.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kvtier/status.h"

namespace kvtier {

inline constexpr uint64_t kKiB = 1024;
inline constexpr uint64_t kMiB = 1024 * kKiB;
inline constexpr uint64_t kGiB = 1024 * kMiB;
inline constexpr uint64_t kTiB = 1024 * kGiB;

// Parses "1073741824", "512MiB", "4GiB", "64KiB", "1TiB" (powers of 1024; also
// "K", "M", "G", "T"; case-insensitive). Errors: INVALID_ARGUMENT naming the
// text when it is empty, has an unknown or ambiguous suffix ("GB": decimal or
// binary?), or overflows 64 bits.
Result<uint64_t> ParseBytes(std::string_view text);

// "1.5 GiB", "256 KiB", "512 B".
std::string FormatBytes(uint64_t bytes);

constexpr uint64_t AlignUp(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

}  // namespace kvtier
