#include "kvtier/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <string>

namespace kvtier {

void LogToStderr(const std::string& name) {
  auto logger = spdlog::get(name);
  if (!logger) logger = spdlog::stderr_color_mt(name);
  spdlog::set_default_logger(std::move(logger));
}

Status CheckLogLevel(std::string_view level) {
  const std::string name(level);
  // from_str returns off for unknown names; only "off" itself may map to off.
  if (spdlog::level::from_str(name) == spdlog::level::off && name != "off") {
    return Status::InvalidArgument("log level '" + name +
                                   "' is unknown (trace, debug, info, warn, error, critical, off)");
  }
  return Status::Ok();
}

Status SetLogLevel(std::string_view level) {
  KVTIER_RETURN_IF_ERROR(CheckLogLevel(level));
  spdlog::set_level(spdlog::level::from_str(std::string(level)));
  return Status::Ok();
}

std::optional<uint64_t> LogLimiter::Admit() {
  std::lock_guard lock(mu_);
  const auto now = std::chrono::steady_clock::now();
  if (logged_ && now - last_ < every_) {
    ++held_back_;
    return std::nullopt;
  }
  logged_ = true;
  last_ = now;
  const uint64_t n = held_back_;
  held_back_ = 0;
  return n;
}

std::string HeldBack(uint64_t n) {
  return n == 0 ? std::string()
                : " (" + std::to_string(n) + " more like it since the last warning)";
}

}  // namespace kvtier
