#include "kvtier/daemon/daemon_options.h"

#include <sys/stat.h>
#include <sys/sysinfo.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <variant>
#include <vector>

#include "kvtier/daemon/metrics.h"
#include "kvtier/units.h"
#include "option_table.h"

namespace kvtier {

Status DaemonOptions::Validate() const {
  if (socket_path.empty()) return Status::InvalidArgument("socket is empty");
  if (socket_path.size() + 6 >= 108) {  // + ".arena" must fit sockaddr_un
    return Status::InvalidArgument("socket path '" + socket_path +
                                   "' is too long for a Unix socket (at most 101 bytes)");
  }
  return core.Validate();
}

std::string DaemonOptions::FlagOf(const std::string& key) {
  std::string flag = key == "nvme_paths" ? "nvme_path" : key;  // one flag per path
  for (char& c : flag) c = c == '_' ? '-' : c;
  return "--" + flag;
}

std::string DaemonOptions::Where(const std::string& key) const {
  if (auto it = from_config.find(key); it != from_config.end()) return it->second;
  return FlagOf(key);
}

Status CheckDramFitsMemory(uint64_t dram_bytes, const std::string& where) {
  if (struct sysinfo si{}; sysinfo(&si) == 0) {
    const uint64_t ram = uint64_t{si.totalram} * si.mem_unit;
    if (dram_bytes > ram) {
      return Status::InvalidArgument(where + " " + std::to_string(dram_bytes) +
                                     " exceeds this machine's memory (" + std::to_string(ram) +
                                     " bytes)");
    }
  }
  return Status::Ok();
}

namespace {

// The value of `key` when it names a tier's eviction policy, else nullptr.
const std::string* Eviction(const RawOptions& r, const std::string& key) {
  return key == "dram_eviction"   ? &r.dram_eviction
         : key == "hbm_eviction"  ? &r.hbm_eviction
         : key == "nvme_eviction" ? &r.nvme_eviction
                                  : nullptr;
}

// The remote tier's MAC key from `path`: kMacKeyBytes raw bytes, or as many hex
// digit pairs (a newline after them allowed). A secret: a file others may read
// or write is refused.
Result<std::string> ReadRemoteKeyFile(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) {
    return Status::InvalidArgument(path + " cannot be read: " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) return Status::InvalidArgument(path + " is not a regular file");
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return Status::InvalidArgument(path + " holds a secret but has mode " + mode +
                                   ": others may read or write it (chmod 600 it)");
  }
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) return Status::InvalidArgument(path + " cannot be read");
  constexpr size_t kKey = RemoteTierOptions::kMacKeyBytes;
  if (text.size() == kKey) return text;
  std::string hex = text;
  if (!hex.empty() && hex.back() == '\n') hex.pop_back();
  if (hex.size() == 2 * kKey && std::all_of(hex.begin(), hex.end(), [](char c) {
        return std::isxdigit(static_cast<unsigned char>(c)) != 0;
      })) {
    std::string key(kKey, '\0');
    for (size_t i = 0; i < kKey; ++i) {
      key[i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
    }
    return key;
  }
  return Status::InvalidArgument(path + " holds " + std::to_string(text.size()) +
                                 " bytes: the key must be " + std::to_string(kKey) +
                                 " bytes, raw or as " + std::to_string(2 * kKey) +
                                 " hex digits (make one with: head -c 32 /dev/urandom > FILE)");
}

// Counts the YAML documents of `text` without building them. yaml-cpp 0.7's LoadAll never
// returns on some malformed text (a stray ',': each document it yields is empty and reads
// nothing; jbeder/yaml-cpp#1040) and grows memory until the process is killed, so a
// document that starts where the previous one did is an error here. Throws YAML::Exception.
// An error at `line` (from 1) of config `path`: "config FILE:LINE: what", the
// form every config error with a line takes (as RawOptions::Where).
Status ConfigError(const std::string& path, int line, const std::string& what) {
  return Status::InvalidArgument("config " + path + ":" + std::to_string(line) + ": " + what);
}

// yaml-cpp's own error, at its mark when it has one.
Status ConfigError(const std::string& path, const YAML::Exception& e) {
  if (e.mark.is_null()) return Status::InvalidArgument("config " + path + ": " + e.msg);
  return ConfigError(path, e.mark.line + 1,
                     e.msg + " (column " + std::to_string(e.mark.column + 1) + ")");
}

Result<size_t> CountYamlDocuments(const std::string& path, const std::string& text) {
  struct Starts : YAML::EventHandler {
    std::optional<YAML::Mark> start;
    void OnDocumentStart(const YAML::Mark& mark) override { start = mark; }
    void OnDocumentEnd() override {}
    void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
    void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
    void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  const std::string&) override {}
    void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                         YAML::EmitterStyle::value) override {}
    void OnSequenceEnd() override {}
    void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                    YAML::EmitterStyle::value) override {}
    void OnMapEnd() override {}
  };
  std::istringstream in(text);
  YAML::Parser parser(in);
  size_t docs = 0;
  std::optional<int> last_start;
  for (;;) {
    Starts doc;
    if (!parser.HandleNextDocument(doc)) break;
    if (doc.start && last_start == doc.start->pos) {
      return ConfigError(path, doc.start->line + 1,
                         "not valid YAML (column " + std::to_string(doc.start->column + 1) + ")");
    }
    last_start = doc.start ? std::optional<int>(doc.start->pos) : std::nullopt;
    ++docs;
  }
  return docs;
}

// The form of `key`'s value in `r` (a byte size, a name among a few): what a
// config file's value must have even when a flag overrides it. Limits that
// depend on the machine or on other settings are checked on the values in use.
Status CheckForm(const std::string& key, const RawOptions& r) {
  const std::map<std::string, const std::string*> sizes = {
      {"dram_bytes", &r.dram_bytes},
      {"session_max_bytes", &r.session_max_bytes},
      {"nvme_bytes", &r.nvme_bytes},
      {"hbm_bytes", &r.hbm_bytes}};
  if (auto it = sizes.find(key); it != sizes.end()) {
    auto bytes = ParseBytes(*it->second);
    if (!bytes.ok()) return Status::InvalidArgument(r.Where(key) + ": " + bytes.status().message());
  } else if (key == "nvme_write_policy") {
    if (auto policy = ParseNvmeWritePolicy(r.nvme_write_policy); !policy.ok()) {
      return r.Named(policy.status());
    }
  } else if (const std::string* e = Eviction(r, key)) {
    if (auto kind = ParseEvictionPolicy(*e); !kind.ok()) {
      return Status::InvalidArgument(r.Where(key) + ": " + kind.status().message());
    }
  } else if (key == "gpu_backend") {
    if (auto backend = ParseHbmBackend(r.gpu_backend); !backend.ok())
      return r.Named(backend.status());
  } else if (key == "metrics_address") {
    if (auto a = ParseMetricsAddress(r.metrics_address); !a.ok()) {
      return Status::InvalidArgument(r.Where(key) + " " + a.status().message());
    }
  } else if (key == "events_address" || key == "events_replay_address") {
    const std::string& a = key == "events_address" ? r.events_address : r.events_replay_address;
    if (a.empty()) return Status::Ok();
    if (Status st = CheckKvEventsAddress(a); !st.ok()) {
      return Status::InvalidArgument(r.Where(key) + " " + st.message());
    }
  } else if (key == "log_level") {
    if (Status st = CheckLogLevel(r.log_level); !st.ok()) {
      return Status(st.code(), r.Where(key) + ": " + st.message());
    }
  } else if (key == "remote") {  // given: empty is a variable that expanded to nothing, say
    if (r.remote.empty()) {
      return Status::InvalidArgument(r.Where(key) +
                                     " is empty: give redis://host:port, or "
                                     "leave it out for no remote tier");
    }
    if (auto seeds = ParseRedisUrl(r.remote); !seeds.ok()) {
      return Status::InvalidArgument(r.Where(key) + ": " + seeds.status().message());
    }
  } else if (const OptionSpec* spec = FindOption(key); spec != nullptr && spec->min <= spec->max) {
    const int64_t v = r.*std::get<int64_t RawOptions::*>(spec->field);
    if (v < spec->min || v > spec->max) {
      return Status::InvalidArgument(r.Where(key) + " " + std::to_string(v) + " is outside " +
                                     std::to_string(spec->min) + ".." + std::to_string(spec->max) +
                                     spec->range_note);
    }
  }
  return Status::Ok();
}

// The config file's one YAML document.
Result<YAML::Node> LoadConfig(const std::string& path) {
  try {
    std::ifstream file(path);
    std::stringstream text;
    text << file.rdbuf();
    if (!file) return Status::InvalidArgument("config " + path + " cannot be read");
    Result<size_t> docs = CountYamlDocuments(path, text.str());
    if (!docs.ok()) return docs.status();
    if (*docs > 1) {  // Load would read the first and drop the rest unseen
      return Status::InvalidArgument("config " + path + " holds " + std::to_string(*docs) +
                                     " YAML documents (---); kvtierd reads one");
    }
    return YAML::Load(text.str());
  } catch (const YAML::Exception& e) {
    return ConfigError(path, e);
  }
}

// nvme_paths, at `line` of config `path`: a directory, or a list of them.
Status ReadNvmePaths(const std::string& path, int line, const YAML::Node& value, RawOptions* dst) {
  if (value.IsNull()) {  // as<std::string> reads it as the text "null"
    return ConfigError(path, line, "key 'nvme_paths' needs a value");
  }
  try {
    dst->nvme_paths.clear();
    int empty_at = 0;
    const auto add = [&](const YAML::Node& p) {
      if (!p.IsScalar()) throw YAML::Exception(p.Mark(), "not a directory");
      dst->nvme_paths.push_back(p.as<std::string>());
      // "" would be the working directory: named here, at its own line.
      if (dst->nvme_paths.back().empty()) empty_at = p.Mark().line + 1;
    };
    if (value.IsSequence()) {
      for (const auto& p : value) add(p);
    } else {
      add(value);
    }
    if (empty_at > 0) {
      return ConfigError(path, empty_at, "nvme_paths gives an empty path: name a directory");
    }
    if (dst->nvme_paths.empty()) {
      return ConfigError(path, line,
                         "nvme_paths is empty (give nvme_bytes: 0 to turn the NVMe tier off)");
    }
    dst->nvme_paths_from_config = true;
  } catch (const YAML::Exception& e) {
    return ConfigError(path, line, "key 'nvme_paths' must be a directory or a list of directories");
  }
  return Status::Ok();
}

Status ApplyYaml(const std::string& path, const CLI::App& app, RawOptions* raw) {
  // Values a flag overrides are read into `overridden` and checked all the same.
  RawOptions overridden;
  overridden.config_path = path;
  Result<YAML::Node> loaded = LoadConfig(path);
  if (!loaded.ok()) return loaded.status();
  const YAML::Node& root = *loaded;
  if (root.IsNull() || (root.IsMap() && root.size() == 0)) {
    raw->config_empty = true;
    return Status::Ok();
  }
  if (!root.IsMap()) return Status::InvalidArgument("config " + path + ": top level is not a map");
  std::set<std::string> seen;
  for (const auto& kv : root) {
    if (!kv.first.IsScalar()) {  // as<std::string> would throw
      return ConfigError(path, kv.first.Mark().line + 1,
                         "a key that is not a name (a list, a map or empty)");
    }
    const std::string key = kv.first.as<std::string>();
    if (!seen.insert(key).second) {  // yaml-cpp keeps the last one silently
      return ConfigError(path, kv.first.Mark().line + 1, "key '" + key + "' appears twice");
    }
    const CLI::Option* given = app.get_option_no_throw(DaemonOptions::FlagOf(key));
    const bool flag_given = given != nullptr && given->count() > 0;
    RawOptions* dst = flag_given ? &overridden : raw;
    dst->from_config[key] = kv.first.Mark().line + 1;
    const int line = kv.first.Mark().line + 1;
    if (key == "nvme_paths") {
      KVTIER_RETURN_IF_ERROR(ReadNvmePaths(path, line, kv.second, dst));
      continue;
    }
    if (!kv.second.IsScalar()) {
      if (kv.second.IsNull()) return ConfigError(path, line, "key '" + key + "' needs a value");
      return ConfigError(path, line,
                         "key '" + key + "' takes one value, not " +
                             (kv.second.IsSequence() ? "a list" : "a map"));
    }
    const OptionSpec* spec = FindOption(key);
    if (spec == nullptr) {
      return ConfigError(path, line, "unknown key '" + key + "' (" + OptionKeys() + ")");
    }
    try {
      if (auto text = std::get_if<std::string RawOptions::*>(&spec->field)) {
        dst->** text = kv.second.as<std::string>();
      } else {
        dst->*std::get<int64_t RawOptions::*>(spec->field) = kv.second.as<int64_t>();
      }
    } catch (const YAML::Exception& e) {
      return ConfigError(path, e.mark.is_null() ? line : e.mark.line + 1,
                         "key '" + key + "' must be " + spec->expected);
    }
  }
  for (const auto& [key, line] : overridden.from_config) {
    if (raw->overridden_error.ok()) raw->overridden_error = CheckForm(key, overridden);
  }
  return Status::Ok();
}

// The settings given, and the options they make: what ParseDaemonOptions' steps share.
struct Given {
  const CLI::App& app;
  RawOptions& raw;
  DaemonOptions& opts;

  // Whether `key`'s flag is on the command line.
  bool Flag(const std::string& key) const {
    const CLI::Option* flag = app.get_option_no_throw(DaemonOptions::FlagOf(key));
    return flag != nullptr && flag->count() > 0;
  }
  // Whether a flag or the config file gives `key`.
  bool Any(const std::string& key) const { return Flag(key) || raw.from_config.count(key) > 0; }
  // A setting given that the tiers on leave unused (`off_key` and `why` say why): logged at
  // start.
  void IgnoreIfGiven(const std::string& key, const std::string& off_key, const std::string& why) {
    if (!Any(key)) return;
    const bool same_file = raw.from_config.count(key) > 0 && raw.from_config.count(off_key) > 0;
    opts.ignored.push_back(raw.Where(key) +
                           " has no effect: " + (same_file ? off_key : raw.Where(off_key)) + why);
  }
  // The byte size `key` gives; with `pages`, a multiple of 4096 (checked whether its tier
  // is on or not: a typo is an error either way).
  Result<uint64_t> Bytes(const std::string& key, std::string RawOptions::*field, bool pages) const {
    auto bytes = ParseBytes(raw.*field);
    if (!bytes.ok()) {
      return Status::InvalidArgument(raw.Where(key) + ": " + bytes.status().message());
    }
    if (pages && *bytes % 4096 != 0) {
      return Status::InvalidArgument(raw.Where(key) + " " + std::to_string(*bytes) +
                                     " is not a multiple of 4096");
    }
    return *bytes;
  }
};

// The socket, logging, metrics and KV events settings.
Status ApplyEndpoints(Given& g) {
  const RawOptions& raw = g.raw;
  DaemonOptions& opts = g.opts;
  opts.socket_path = raw.socket;
  opts.socket_group = raw.socket_group;
  opts.log_level = raw.log_level;
  KVTIER_RETURN_IF_ERROR(CheckForm("metrics_address", raw));
  opts.metrics_address = raw.metrics_address;
  opts.metrics_default = !g.Any("metrics_address");
  for (const char* key : {"events_address", "events_replay_address"}) {
    KVTIER_RETURN_IF_ERROR(CheckForm(key, raw));
  }
  if (raw.events_address.empty() && !raw.events_replay_address.empty()) {
    return Status::InvalidArgument(raw.Where("events_replay_address") +
                                   " needs --events-address (events are off without it)");
  }
  opts.events_address = raw.events_address;
  opts.events_replay_address = raw.events_replay_address;
  return Status::Ok();
}

// The DRAM arena, the tiers' eviction policies, the session bound and the TTLs.
Status ApplyDram(Given& g, uint64_t dram_bytes) {
  const RawOptions& raw = g.raw;
  CacheCoreOptions& core = g.opts.core;
  KVTIER_RETURN_IF_ERROR(CheckDramFitsMemory(dram_bytes, raw.Where("dram_bytes")));
  core.dram_bytes = dram_bytes;
  EvictionPolicyKind eviction[3];
  for (int i = 0; const char* key : {"dram_eviction", "hbm_eviction", "nvme_eviction"}) {
    KVTIER_RETURN_IF_ERROR(CheckForm(key, raw));
    eviction[i++] = *ParseEvictionPolicy(*Eviction(raw, key));
  }
  core.dram_eviction = eviction[0];
  core.hbm.eviction = eviction[1];
  core.nvme.eviction = eviction[2];
  auto session_max = g.Bytes("session_max_bytes", &RawOptions::session_max_bytes, false);
  if (!session_max.ok()) return session_max.status();
  core.session_max_bytes = *session_max;
  core.lease_ttl = std::chrono::milliseconds(raw.lease_ttl_ms);
  core.reservation_ttl = std::chrono::milliseconds(raw.reservation_ttl_ms);
  g.opts.drain_timeout = std::chrono::milliseconds(raw.drain_timeout_ms);
  return Status::Ok();
}

// The NVMe tier: off when nvme_bytes is 0. Returns nvme_bytes.
Result<uint64_t> ApplyNvme(Given& g) {
  RawOptions& raw = g.raw;
  DaemonOptions& opts = g.opts;
  auto nvme_bytes = g.Bytes("nvme_bytes", &RawOptions::nvme_bytes, true);
  if (!nvme_bytes.ok()) return nvme_bytes.status();
  auto policy = ParseNvmeWritePolicy(raw.nvme_write_policy);
  if (!policy.ok()) return raw.Named(policy.status());
  for (const std::string& p : raw.nvme_paths) {  // "" would be the working directory
    if (p.empty()) {
      return Status::InvalidArgument(raw.Where("nvme_paths") +
                                     " gives an empty path: name a directory");
    }
  }
  if (*nvme_bytes == 0 && raw.nvme_paths_from_config && g.Flag("nvme_bytes")) {
    g.IgnoreIfGiven("nvme_paths", "nvme_bytes", " 0 turns the NVMe tier off");
    raw.nvme_paths.clear();  // the flag wins over the file
  }
  if (*nvme_bytes == 0) {  // DRAM only
    if (!raw.nvme_paths.empty()) {
      return Status::InvalidArgument(raw.Where("nvme_bytes") + " 0 turns the NVMe tier off, but " +
                                     raw.Where("nvme_paths") +
                                     " gives paths: drop them or give a size");
    }
    if (raw.rebuild_index) {
      return Status::InvalidArgument("--rebuild-index needs the NVMe tier (nvme_bytes is 0)");
    }
    for (const std::string key :
         {"nvme_write_policy", "selective_min_hits", "nvme_queue_depth", "nvme_eviction"}) {
      g.IgnoreIfGiven(key, "nvme_bytes", " 0 turns the NVMe tier off");
    }
    return *nvme_bytes;
  }
  opts.nvme_default_path = raw.nvme_paths.empty();
  opts.core.nvme_workers = static_cast<uint32_t>(raw.nvme_workers);
  opts.core.nvme_write_policy = *policy;
  opts.core.selective_min_hits = static_cast<uint32_t>(raw.selective_min_hits);
  opts.core.nvme.paths =
      raw.nvme_paths.empty() ? std::vector<std::string>{kDefaultNvmePath} : raw.nvme_paths;
  opts.core.nvme.bytes_per_path = *nvme_bytes;
  opts.core.nvme.queue_depth = static_cast<uint32_t>(raw.nvme_queue_depth);
  return *nvme_bytes;
}

// The HBM tier: off when hbm_bytes is 0.
Status ApplyHbm(Given& g, uint64_t nvme_bytes) {
  const RawOptions& raw = g.raw;
  CacheCoreOptions& core = g.opts.core;
  auto hbm_bytes = g.Bytes("hbm_bytes", &RawOptions::hbm_bytes, true);
  if (!hbm_bytes.ok()) return hbm_bytes.status();
  auto backend = ParseHbmBackend(raw.gpu_backend);
  if (!backend.ok()) return raw.Named(backend.status());
  core.hbm.bytes = *hbm_bytes;
  core.hbm.device = static_cast<int>(raw.gpu);
  core.hbm.backend = *backend;
  if (*hbm_bytes > 0) core.nvme_workers = static_cast<uint32_t>(raw.nvme_workers);
  if (*hbm_bytes == 0) g.IgnoreIfGiven("hbm_eviction", "hbm_bytes", " 0 turns the HBM tier off");
  if (nvme_bytes == 0 && *hbm_bytes == 0) {  // the I/O workers serve NVMe and HBM copies
    g.IgnoreIfGiven("nvme_workers", "nvme_bytes", " 0 and hbm_bytes 0 leave the I/O workers idle");
  }
  return Status::Ok();
}

// The remote tier's settings (opts.core.remote), checked. A remote tier needs NVMe.
Status ApplyRemote(Given& g, uint64_t nvme_bytes) {
  const RawOptions& raw = g.raw;
  DaemonOptions& opts = g.opts;
  if (g.Any("remote")) KVTIER_RETURN_IF_ERROR(CheckForm("remote", raw));
  if (raw.remote.empty()) {
    for (const std::string key : {"remote_pool_size", "remote_timeout_ms", "remote_key_file"}) {
      g.IgnoreIfGiven(key, "remote", " is not set (no remote tier)");
    }
    return Status::Ok();
  }
  if (nvme_bytes == 0) {
    return Status::InvalidArgument(raw.Where("remote") + " needs the NVMe tier, but " +
                                   raw.Where("nvme_bytes") +
                                   " is 0 (remote writes go with the NVMe writer's batches)");
  }
  opts.core.remote.url = raw.remote;
  opts.core.remote.pool_size = static_cast<uint32_t>(raw.remote_pool_size);
  opts.core.remote.timeout = std::chrono::milliseconds(raw.remote_timeout_ms);
  if (!raw.remote_key_file.empty()) {
    auto key = ReadRemoteKeyFile(raw.remote_key_file);
    if (!key.ok()) {
      return Status(key.status().code(),
                    raw.Where("remote_key_file") + ": " + key.status().message());
    }
    opts.core.remote.mac_key = std::move(key).value();
    opts.remote_key_file = raw.remote_key_file;
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
  raw.drain_timeout_ms = opts.drain_timeout.count();
  std::string config;

  CLI::App app{"kvtierd: tiered KV-cache offload daemon (HBM, DRAM and NVMe tiers)", "kvtierd"};
  app.set_version_flag("--version", "kvtierd " KVTIER_VERSION);
  app.add_option("--config", config, "YAML config file; flags win over it")
      ->check(CLI::ExistingFile);
  for (const OptionSpec& spec : OptionTable()) {
    const std::string flag = DaemonOptions::FlagOf(spec.key);
    CLI::Option* o = std::visit(
        [&](auto field) -> CLI::Option* {
          if constexpr (std::is_same_v<decltype(field), bool RawOptions::*>) {
            return app.add_flag(flag, raw.*field, spec.help);
          } else {
            return app.add_option(flag, raw.*field, spec.help);
          }
        },
        spec.field);
    if (!spec.no_default && !spec.flag_only) o->capture_default_str();
  }
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
  raw.config_path = config;
  if (!config.empty()) KVTIER_RETURN_IF_ERROR(ApplyYaml(config, app, &raw));

  for (const OptionSpec& spec : OptionTable()) {  // the integers' ranges
    if (spec.min <= spec.max) KVTIER_RETURN_IF_ERROR(CheckForm(spec.key, raw));
  }
  Given given{app, raw, opts};
  auto dram = given.Bytes("dram_bytes", &RawOptions::dram_bytes, false);
  if (!dram.ok()) return dram.status();
  KVTIER_RETURN_IF_ERROR(ApplyEndpoints(given));
  KVTIER_RETURN_IF_ERROR(ApplyDram(given, *dram));
  auto nvme_bytes = ApplyNvme(given);
  if (!nvme_bytes.ok()) return nvme_bytes.status();
  KVTIER_RETURN_IF_ERROR(ApplyHbm(given, *nvme_bytes));
  KVTIER_RETURN_IF_ERROR(ApplyRemote(given, *nvme_bytes));
  for (const auto& [key, line] : raw.from_config) opts.from_config[key] = raw.Where(key);
  for (const CLI::Option* o : app.get_options()) {
    if (o->count() == 0 || o->get_lnames().empty()) continue;
    std::string key = o->get_lnames().front();
    for (char& c : key) c = c == '-' ? '_' : c;
    opts.from_flags.insert(key == "nvme_path" ? "nvme_paths" : key);
  }
  if (raw.config_empty) {
    opts.ignored.push_back("config " + raw.config_path + " sets nothing (it holds no keys)");
  }
  opts.rebuild_index = raw.rebuild_index;
  if (Status st = opts.Validate(); !st.ok()) return raw.Named(st);
  KVTIER_RETURN_IF_ERROR(CheckForm("log_level", raw));
  KVTIER_RETURN_IF_ERROR(raw.overridden_error);
  return opts;
}

}  // namespace kvtier
