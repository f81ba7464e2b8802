// Logging setup: kvtier logs through spdlog's default logger.
#pragma once

#include <string_view>

#include "kvtier/status.h"

namespace kvtier {

// Sets the default logger's level from "trace", "debug", "info", "warn",
// "error", "critical" or "off". Errors: INVALID_ARGUMENT naming the level.
Status SetLogLevel(std::string_view level);

}  // namespace kvtier
