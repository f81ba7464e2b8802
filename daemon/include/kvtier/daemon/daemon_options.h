// DaemonOptions: everything kvtierd is configured with, loaded in one place
// from a YAML file (--config) and command-line flags; flags win over the file.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "kvtier/daemon/cache_core.h"
#include "kvtier/socket_path.h"
#include "kvtier/status.h"

namespace kvtier {

// The NVMe tier's directory when none is given, relative to kvtierd's cwd.
inline constexpr const char* kDefaultNvmePath = "kvtier-data";

struct DaemonOptions {
  // gRPC Unix socket; its directory is created 0700 (0750 with socket_group).
  // Default: DefaultSocketPath().
  std::string socket_path = DefaultSocketPath();
  // Group allowed to connect (directory 0750, socket 0660). Default: "" (owner only).
  std::string socket_group;
  // trace, debug, info, warn, error, critical, off. Default: "info".
  std::string log_level = "info";
  // Cache sizes, TTLs and limits (dram_bytes default 1 GiB; TTLs 30 s). The
  // NVMe tier is on by default: 8 GiB under ./kvtier-data; --nvme-bytes 0
  // turns it off.
  CacheCoreOptions core;
  // True when core.nvme.paths is the default, kDefaultNvmePath: kvtierd
  // creates that directory when it is missing (a path given must exist).
  bool nvme_default_path = false;
  // At shutdown, how long the NVMe writes still pending (write-through queue,
  // write-back of what is only in DRAM) may take; past it kvtierd stops
  // without them (they are lost, as with kill -9). Range 0..1 h. Default: 10 s.
  std::chrono::milliseconds drain_timeout{10000};
  // Rebuild the NVMe tier's RocksDB index from the slot headers before
  // serving (when the index is missing or corrupt). Default: false.
  bool rebuild_index = false;
  // Prometheus /metrics: "HOST:PORT" or "off" (metrics.h, ParseMetricsAddress).
  // Default: "127.0.0.1:9400".
  std::string metrics_address = "127.0.0.1:9400";
  // True when metrics_address is the default: kvtierd then serves without
  // metrics (with a warning) when the port is taken, e.g. by a second kvtierd;
  // an address given that cannot be listened on refuses the start.
  bool metrics_default = true;
  // KV events (kv_event_publisher.h): the ZMQ PUB endpoint kvtierd binds,
  // tcp://HOST:PORT or ipc://PATH (CheckKvEventsAddress); "" for none.
  // Default: "".
  std::string events_address;
  // Their replay ROUTER endpoint, same forms; "" for none. Needs
  // events_address. Default: "".
  std::string events_replay_address;
  // The file the remote tier's MAC key was read from (core.remote.mac_key):
  // 32 bytes, raw or as 64 hex digits, readable by its owner only. "" for none
  // (the store must then be trusted). Default: "".
  std::string remote_key_file;
  // Settings given that have no effect (an NVMe setting with the NVMe tier
  // off, a config file that sets nothing), each naming its flag, or its
  // config file and line: kvtierd logs them at start.
  std::vector<std::string> ignored;
  // Where each setting read from the config file came from ("config FILE:LINE:
  // key"), for errors found after parsing (kvtierd's start); a key not in it
  // came from its flag or its default.
  std::map<std::string, std::string> from_config;
  // The keys whose flag was on the command line (flags win over the file).
  std::set<std::string> from_flags;

  Status Validate() const;
  // For an error about setting `key` (a YAML key): "config FILE:LINE: key"
  // when the config file gave it, else its flag ("--socket-group").
  std::string Where(const std::string& key) const;
  // The flag of YAML key `key`: "--" and the key with '-' for '_' ("nvme_paths": --nvme-path).
  static std::string FlagOf(const std::string& key);
};

// OK when a DRAM arena of `dram_bytes` fits this machine's memory (sysinfo's
// total RAM); else INVALID_ARGUMENT that starts with `where` (a flag, or
// "config <path>:<line>: dram_bytes"). The arena is not preallocated: one larger
// than RAM would start, then meet the OOM killer as it fills.
Status CheckDramFitsMemory(uint64_t dram_bytes, const std::string& where);

// One setting of kvtierd as it runs (kvtierctl config).
struct ConfigSetting {
  std::string key;     // the YAML key
  std::string value;   // as text: bytes and milliseconds in plain integers
  std::string source;  // "default", "flag", "config FILE:LINE: key", or "built-in" (no flag)
};
// Every option after defaults, the config file and flags merged, in a fixed
// order. No option is secret today (namespace salts come from clients and are
// never kept here); a secret added later must be redacted here.
std::vector<ConfigSetting> EffectiveConfig(const DaemonOptions& options);

// Parses argv (and the YAML file named by --config). Returns the options, or
// INVALID_ARGUMENT naming the bad flag, key or value. `exit_code` is set (and
// the options are meaningless) when the command line asked for --help or
// --version: print nothing more and exit with it.
Result<DaemonOptions> ParseDaemonOptions(int argc, char** argv, int* exit_code);

}  // namespace kvtier
