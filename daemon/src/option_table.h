// kvtierd's settings, each declared once: the table that drives its flags (CLI11), its YAML
// keys, the form every given value must have, and what kvtierctl config shows
// (daemon_options.cc and effective_config.cc read it; nothing else lists the settings).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "kvtier/daemon/daemon_options.h"
#include "kvtier/status.h"

namespace kvtier {

// The settings as given (flags, then the config file under them), before they are checked
// and turned into DaemonOptions. The defaults here are those of DaemonOptions and
// CacheCoreOptions (ParseDaemonOptions copies the ones those structs hold).
struct RawOptions {
  std::string socket, socket_group, log_level, dram_bytes, nvme_bytes = "8GiB";
  std::string session_max_bytes = "0";
  std::string nvme_write_policy = "write_through";
  std::string dram_eviction = "lru", hbm_eviction = "lru", nvme_eviction = "lru";
  int64_t selective_min_hits = 2;
  std::vector<std::string> nvme_paths;
  bool nvme_paths_from_config = false;  // a flag's --nvme-bytes 0 then wins over them
  int64_t nvme_queue_depth = 32;
  int64_t nvme_workers = 2;
  int64_t lease_ttl_ms = 0, reservation_ttl_ms = 0, drain_timeout_ms = 0;
  std::string hbm_bytes = "0", gpu_backend = "cuda";
  std::string metrics_address = "127.0.0.1:9400";
  std::string remote;           // "" = no remote tier
  std::string remote_key_file;  // "" = no MAC on remote images
  int64_t remote_pool_size = 4, remote_timeout_ms = 200;
  std::string events_address, events_replay_address;
  int64_t gpu = 0;
  bool rebuild_index = false;
  std::string config_path;                 // --config, when given
  std::map<std::string, int> from_config;  // key -> its line (from 1), when no flag gave it
  bool config_empty = false;               // it sets nothing (no keys: empty, comments, {} or null)
  // The first bad value of the config file among those flags override: reported
  // after the values in use are checked.
  Status overridden_error;

  // Where `key`'s value came from, for errors: "config FILE:LINE: key" or its flag.
  std::string Where(const std::string& key) const;
  // `st`, whose message starts with the key it is about (as CacheCoreOptions::
  // Validate's do), naming where that key's value came from instead.
  Status Named(const Status& st) const;
};

// One setting. Its flag is DaemonOptions::FlagOf(key); a flag-only setting has no YAML key.
struct OptionSpec {
  using Field = std::variant<std::string RawOptions::*, int64_t RawOptions::*, bool RawOptions::*,
                             std::vector<std::string> RawOptions::*>;
  const char* key;       // the YAML key ("nvme_paths" is --nvme-path, repeatable)
  Field field;           // where its value goes in RawOptions
  const char* help;      // kvtierd --help
  const char* expected;  // what a config file's value must be, for its error
  // An integer's range, checked as its form (a config value a flag overrides included)
  // when min <= max; `range_note` follows the range in the error (" (1 hour)").
  int64_t min = 1, max = 0;
  const char* range_note = "";
  bool flag_only = false;   // no YAML key (--rebuild-index)
  bool no_default = false;  // --help shows no default (the setting is off unless given)
  // Its value as kvtierd runs it, as text (kvtierctl config): bytes and milliseconds as
  // plain integers.
  std::string (*effective)(const DaemonOptions&) = nullptr;
};

// Every setting, in the order of kvtierd --help and kvtierctl config.
std::span<const OptionSpec> OptionTable();
// The setting of YAML key `key`; nullptr for none (or a flag-only one).
const OptionSpec* FindOption(std::string_view key);
// "socket, socket_group, ...": every YAML key, for the error of an unknown one.
std::string OptionKeys();

}  // namespace kvtier
