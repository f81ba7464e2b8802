#include "kvtier/units.h"

#include <cctype>
#include <charconv>
#include <cstdio>
#include <limits>

namespace kvtier {

Result<uint64_t> ParseBytes(std::string_view text) {
  const std::string quoted = "'" + std::string(text) + "'";
  if (text.empty()) return Status::InvalidArgument("byte size is empty");
  uint64_t number = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), number);
  if (ec == std::errc::result_out_of_range) {
    return Status::InvalidArgument("byte size " + quoted + " overflows 64 bits");
  }
  if (ec != std::errc() || end == text.data()) {
    return Status::InvalidArgument("byte size " + quoted + " does not start with a number");
  }
  std::string_view rest(end, static_cast<size_t>(text.data() + text.size() - end));
  if (!rest.empty() && (rest.front() == '.' || rest.front() == ',')) {
    return Status::InvalidArgument("byte size " + quoted +
                                   " is not a whole number (write 1536MiB, not 1.5GiB)");
  }
  while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
  std::string suffix;
  for (char c : rest)
    suffix.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(c))));
  uint64_t unit = 1;
  if (suffix.empty() || suffix == "B") {
    unit = 1;
  } else if (suffix == "K" || suffix == "KIB") {
    unit = kKiB;
  } else if (suffix == "M" || suffix == "MIB") {
    unit = kMiB;
  } else if (suffix == "G" || suffix == "GIB") {
    unit = kGiB;
  } else if (suffix == "T" || suffix == "TIB") {
    unit = kTiB;
  } else if (suffix == "KB" || suffix == "MB" || suffix == "GB" || suffix == "TB") {
    // Decimal or binary? Both are in use; refuse rather than guess.
    return Status::InvalidArgument("byte size " + quoted +
                                   " is ambiguous: write KiB, MiB, GiB or TiB (powers of 1024)");
  } else {
    return Status::InvalidArgument("byte size " + quoted +
                                   " has an unknown unit (use B, KiB, MiB, GiB or TiB)");
  }
  if (number > std::numeric_limits<uint64_t>::max() / unit) {
    return Status::InvalidArgument("byte size " + quoted + " overflows 64 bits");
  }
  return number * unit;
}

std::string FormatBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  char buf[32];
  if (unit == 0) {
    std::snprintf(buf, sizeof(buf), "%llu B", static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(buf, sizeof(buf), "%.1f %s", value, kUnits[unit]);
  }
  return buf;
}

}  // namespace kvtier
