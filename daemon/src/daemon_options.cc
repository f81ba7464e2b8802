#include "kvtier/daemon/daemon_options.h"

#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <map>

#include "kvtier/units.h"

namespace kvtier {

Status DaemonOptions::Validate() const {
  if (socket_path.empty()) return Status::InvalidArgument("socket is empty");
  if (socket_path.size() + 6 >= 108) {  // + ".arena" must fit sockaddr_un
    return Status::InvalidArgument("socket path '" + socket_path +
                                   "' is too long for a Unix socket (at most 101 bytes)");
  }
  return core.Validate();
}

namespace {

struct RawOptions {
  std::string socket, socket_group, log_level, dram_bytes;
  int64_t lease_ttl_ms = 0, reservation_ttl_ms = 0;
  std::string dram_bytes_from = "--dram-bytes";  // where dram_bytes came from, for errors
};

Status ApplyYaml(const std::string& path, const CLI::App& app, RawOptions* raw) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument("config " + path + ": " + e.what());
  }
  if (root.IsNull()) return Status::Ok();
  if (!root.IsMap()) return Status::InvalidArgument("config " + path + ": top level is not a map");
  for (const auto& kv : root) {
    const std::string key = kv.first.as<std::string>();
    const std::string flag = "--" + [&] {
      std::string f = key;
      for (char& c : f) c = c == '_' ? '-' : c;
      return f;
    }();
    const CLI::Option* given = app.get_option_no_throw(flag);
    const bool flag_given = given != nullptr && given->count() > 0;
    const char* expected = "a string";
    if (!kv.second.IsScalar()) {
      return Status::InvalidArgument("config " + path + ": key '" + key + "' needs a value");
    }
    try {
      if (key == "socket") {
        if (!flag_given) raw->socket = kv.second.as<std::string>();
      } else if (key == "socket_group") {
        if (!flag_given) raw->socket_group = kv.second.as<std::string>();
      } else if (key == "log_level") {
        if (!flag_given) raw->log_level = kv.second.as<std::string>();
      } else if (key == "dram_bytes") {
        expected = "a byte size such as 4GiB";
        if (!flag_given) {
          raw->dram_bytes = kv.second.as<std::string>();
          raw->dram_bytes_from = "config " + path + ": dram_bytes";
        }
      } else if (key == "lease_ttl_ms" || key == "reservation_ttl_ms") {
        expected = "an integer number of milliseconds";
        if (!flag_given) {
          (key == "lease_ttl_ms" ? raw->lease_ttl_ms : raw->reservation_ttl_ms) =
              kv.second.as<int64_t>();
        }
      } else {
        return Status::InvalidArgument("config " + path + ": unknown key '" + key +
                                       "' (socket, socket_group, log_level, dram_bytes, "
                                       "lease_ttl_ms, reservation_ttl_ms)");
      }
    } catch (const YAML::Exception& e) {
      return Status::InvalidArgument("config " + path + ": key '" + key + "' must be " +
                                     expected + " (line " + std::to_string(e.mark.line + 1) +
                                     ")");
    }
  }
  return Status::Ok();
}

}  // namespace

Result<DaemonOptions> ParseDaemonOptions(int argc, char** argv, int* exit_code) {
  *exit_code = -1;
  DaemonOptions opts;
  RawOptions raw;
  raw.socket = opts.socket_path;
  raw.log_level = opts.log_level;
  raw.dram_bytes = std::to_string(opts.core.dram_bytes);
  raw.lease_ttl_ms = opts.core.lease_ttl.count();
  raw.reservation_ttl_ms = opts.core.reservation_ttl.count();
  std::string config;

  CLI::App app{"kvtierd: tiered KV-cache offload daemon (DRAM tier)", "kvtierd"};
  app.set_version_flag("--version", "kvtierd 0.1.0");
  app.add_option("--config", config, "YAML config file; flags win over it")->check(CLI::ExistingFile);
  app.add_option("--socket", raw.socket, "gRPC Unix socket path")
      ->capture_default_str();
  app.add_option("--socket-group", raw.socket_group,
                 "group allowed to connect (directory 0750, socket 0660)");
  app.add_option("--dram-bytes", raw.dram_bytes,
                 "DRAM arena size, e.g. 512MiB, 4GiB (a multiple of 4 KiB)")
      ->capture_default_str();
  app.add_option("--log-level", raw.log_level, "trace|debug|info|warn|error|critical|off")
      ->capture_default_str();
  app.add_option("--lease-ttl-ms", raw.lease_ttl_ms, "a read lease ends by itself after this")
      ->capture_default_str();
  app.add_option("--reservation-ttl-ms", raw.reservation_ttl_ms,
                 "an uncommitted write is freed after this")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    *exit_code = app.exit(e);
    return Status::InvalidArgument("help");
  } catch (const CLI::CallForVersion& e) {
    *exit_code = app.exit(e);
    return Status::InvalidArgument("version");
  } catch (const CLI::ParseError& e) {
    return Status::InvalidArgument(e.what());
  }
  if (!config.empty()) KVTIER_RETURN_IF_ERROR(ApplyYaml(config, app, &raw));

  auto dram = ParseBytes(raw.dram_bytes);
  if (!dram.ok()) {
    return Status::InvalidArgument(raw.dram_bytes_from + ": " + dram.status().message());
  }
  opts.socket_path = raw.socket;
  opts.socket_group = raw.socket_group;
  opts.log_level = raw.log_level;
  opts.core.dram_bytes = *dram;
  opts.core.lease_ttl = std::chrono::milliseconds(raw.lease_ttl_ms);
  opts.core.reservation_ttl = std::chrono::milliseconds(raw.reservation_ttl_ms);
  KVTIER_RETURN_IF_ERROR(opts.Validate());
  return opts;
}

}  // namespace kvtier
