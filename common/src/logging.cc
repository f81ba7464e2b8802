#include "kvtier/logging.h"

#include <spdlog/spdlog.h>

#include <string>

namespace kvtier {

Status SetLogLevel(std::string_view level) {
  const std::string name(level);
  auto parsed = spdlog::level::from_str(name);
  // from_str returns off for unknown names; only "off" itself may map to off.
  if (parsed == spdlog::level::off && name != "off") {
    return Status::InvalidArgument("log level '" + name +
                                   "' is unknown (trace, debug, info, warn, error, critical, off)");
  }
  spdlog::set_level(parsed);
  return Status::Ok();
}

}  // namespace kvtier
