// Fuzz target: ParseBytes (kvtier/units.h), the size parser behind --dram-bytes,
// --nvme-bytes, --hbm-bytes and their YAML keys.
//
// Input: the text, as is. Checks, besides ASan/UBSan: ParseBytes agrees with an independent
// model of its grammar (decimal digits, then optionally spaces and a unit B, K, KiB, M, MiB,
// G, GiB, T or TiB in any case; a value past 2^64 - 1 is refused), errors are
// INVALID_ARGUMENT with a message, and FormatBytes of an accepted size names a unit.
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "fuzz_check.h"
#include "kvtier/units.h"

namespace {

std::optional<uint64_t> Model(std::string_view text) {
  size_t i = 0;
  unsigned __int128 value = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
    value = value * 10 + static_cast<unsigned>(text[i] - '0');
    if (value > UINT64_MAX) return std::nullopt;
    ++i;
  }
  if (i == 0) return std::nullopt;
  while (i < text.size() && text[i] == ' ') ++i;
  std::string unit;
  for (; i < text.size(); ++i) {
    unit.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(text[i]))));
  }
  uint64_t scale = 0;
  if (unit.empty() || unit == "B") scale = 1;
  if (unit == "K" || unit == "KIB") scale = kvtier::kKiB;
  if (unit == "M" || unit == "MIB") scale = kvtier::kMiB;
  if (unit == "G" || unit == "GIB") scale = kvtier::kGiB;
  if (unit == "T" || unit == "TIB") scale = kvtier::kTiB;
  if (scale == 0) return std::nullopt;
  value *= scale;
  if (value > UINT64_MAX) return std::nullopt;
  return static_cast<uint64_t>(value);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const kvtier::Result<uint64_t> parsed = kvtier::ParseBytes(text);
  const std::optional<uint64_t> expected = Model(text);
  FUZZ_CHECK(parsed.ok() == expected.has_value(), "ParseBytes and the model disagree on accepting");
  if (!parsed.ok()) {
    FUZZ_CHECK(parsed.status().code() == kvtier::StatusCode::kInvalidArgument,
               "a refused size is not INVALID_ARGUMENT");
    FUZZ_CHECK(!parsed.status().message().empty(), "a refused size has no message");
    return 0;
  }
  FUZZ_CHECK(*parsed == *expected, "ParseBytes and the model disagree on the value");
  const std::string formatted = kvtier::FormatBytes(*parsed);
  FUZZ_CHECK(formatted.find('B') != std::string::npos, "FormatBytes names no unit");
  return 0;
}
