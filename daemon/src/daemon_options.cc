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
#include <tuple>
#include <vector>

#include "kvtier/daemon/metrics.h"
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
  std::string config_path;                 // --config, when given
  std::map<std::string, int> from_config;  // key -> its line (from 1), when no flag gave it
  bool config_empty = false;               // it sets nothing (no keys: empty, comments, {} or null)
  // The first bad value of the config file among those flags override: reported
  // after the values in use are checked.
  Status overridden_error;

  // The value of `key` when it names a tier's eviction policy, else nullptr.
  std::string* Eviction(const std::string& key) {
    return key == "dram_eviction"   ? &dram_eviction
           : key == "hbm_eviction"  ? &hbm_eviction
           : key == "nvme_eviction" ? &nvme_eviction
                                    : nullptr;
  }
  const std::string* Eviction(const std::string& key) const {
    return const_cast<RawOptions*>(this)->Eviction(key);
  }
  // Where `key`'s value came from, for errors: "config FILE:LINE: key" or its flag.
  std::string Where(const std::string& key) const {
    const auto line = from_config.find(key);
    if (line == from_config.end()) return DaemonOptions::FlagOf(key);
    return "config " + config_path + ":" + std::to_string(line->second) + ": " + key;
  }
  // `st`, whose message starts with the key it is about (as CacheCoreOptions::
  // Validate's do), naming where that key's value came from instead.
  Status Named(const Status& st) const {
    for (const std::string key :
         {"socket", "dram_bytes", "lease_ttl_ms", "reservation_ttl_ms", "nvme_workers",
          "selective_min_hits", "nvme_write_policy", "gpu_backend", "dram_eviction", "hbm_eviction",
          "nvme_eviction"}) {
      const std::string& m = st.message();
      if (m.size() > key.size() && m.rfind(key, 0) == 0 &&
          (m[key.size()] == ' ' || m[key.size()] == ':')) {
        return Status(st.code(), Where(key) + m.substr(key.size()));
      }
    }
    return st;
  }
};

Status CheckForm(const std::string& key, const RawOptions& r);

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

// The remote tier's settings (opts.core.remote), checked. A remote tier needs NVMe.
template <typename IgnoreIfGiven>
Status ApplyRemote(const RawOptions& raw, uint64_t nvme_bytes, bool remote_given,
                   const IgnoreIfGiven& ignore_if_given, DaemonOptions* opts) {
  KVTIER_RETURN_IF_ERROR(CheckForm("remote_pool_size", raw));
  KVTIER_RETURN_IF_ERROR(CheckForm("remote_timeout_ms", raw));
  if (remote_given) KVTIER_RETURN_IF_ERROR(CheckForm("remote", raw));
  if (raw.remote.empty()) {
    for (const std::string key : {"remote_pool_size", "remote_timeout_ms", "remote_key_file"}) {
      ignore_if_given(key, "remote", " is not set (no remote tier)");
    }
    return Status::Ok();
  }
  if (nvme_bytes == 0) {
    return Status::InvalidArgument(raw.Where("remote") + " needs the NVMe tier, but " +
                                   raw.Where("nvme_bytes") +
                                   " is 0 (remote writes go with the "
                                   "NVMe writer's batches)");
  }
  opts->core.remote.url = raw.remote;
  opts->core.remote.pool_size = static_cast<uint32_t>(raw.remote_pool_size);
  opts->core.remote.timeout = std::chrono::milliseconds(raw.remote_timeout_ms);
  if (!raw.remote_key_file.empty()) {
    auto key = ReadRemoteKeyFile(raw.remote_key_file);
    if (!key.ok()) {
      return Status(key.status().code(),
                    raw.Where("remote_key_file") + ": " + key.status().message());
    }
    opts->core.remote.mac_key = std::move(key).value();
    opts->remote_key_file = raw.remote_key_file;
  }
  return Status::Ok();
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
  } else if (const std::string* e = r.Eviction(key)) {
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
  } else if (key == "remote_pool_size" || key == "remote_timeout_ms") {
    const bool pool = key == "remote_pool_size";
    const int64_t v = pool ? r.remote_pool_size : r.remote_timeout_ms;
    const int64_t most = pool ? 256 : 60'000;
    if (v < 1 || v > most) {
      return Status::InvalidArgument(r.Where(key) + " " + std::to_string(v) + " is outside 1.." +
                                     std::to_string(most));
    }
  }
  return Status::Ok();
}

Status ApplyYaml(const std::string& path, const CLI::App& app, RawOptions* raw) {
  // Values a flag overrides are read into `overridden` and checked all the same.
  RawOptions overridden;
  overridden.config_path = path;
  YAML::Node root;
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
    root = YAML::Load(text.str());
  } catch (const YAML::Exception& e) {
    return ConfigError(path, e);
  }
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
    const char* expected = "a string";
    const int line = kv.first.Mark().line + 1;
    if (key == "nvme_paths") {   // a list of directories, or one
      if (kv.second.IsNull()) {  // as<std::string> reads it as the text "null"
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
        if (kv.second.IsSequence()) {
          for (const auto& p : kv.second) add(p);
        } else {
          add(kv.second);
        }
        if (empty_at > 0) {
          return ConfigError(path, empty_at, "nvme_paths gives an empty path: name a directory");
        }
        if (dst->nvme_paths.empty()) {
          return ConfigError(path, line,
                             "nvme_paths is empty (give nvme_bytes: 0 to turn the "
                             "NVMe tier off)");
        }
        dst->nvme_paths_from_config = true;
      } catch (const YAML::Exception& e) {
        return ConfigError(path, line,
                           "key 'nvme_paths' must be a directory or a list of directories");
      }
      continue;
    }
    if (!kv.second.IsScalar()) {
      if (kv.second.IsNull()) return ConfigError(path, line, "key '" + key + "' needs a value");
      return ConfigError(path, line,
                         "key '" + key + "' takes one value, not " +
                             (kv.second.IsSequence() ? "a list" : "a map"));
    }
    try {
      if (key == "socket") {
        dst->socket = kv.second.as<std::string>();
      } else if (key == "socket_group") {
        dst->socket_group = kv.second.as<std::string>();
      } else if (key == "metrics_address") {
        dst->metrics_address = kv.second.as<std::string>();
      } else if (key == "events_address") {
        dst->events_address = kv.second.as<std::string>();
      } else if (key == "events_replay_address") {
        dst->events_replay_address = kv.second.as<std::string>();
      } else if (key == "log_level") {
        dst->log_level = kv.second.as<std::string>();
      } else if (key == "dram_bytes") {
        expected = "a byte size such as 4GiB";
        dst->dram_bytes = kv.second.as<std::string>();
      } else if (key == "session_max_bytes") {
        expected = "a byte size such as 1GiB";
        dst->session_max_bytes = kv.second.as<std::string>();
      } else if (key == "nvme_bytes") {
        expected = "a byte size such as 64GiB";
        dst->nvme_bytes = kv.second.as<std::string>();
      } else if (key == "nvme_write_policy") {
        expected = "write_through, write_back or selective";
        dst->nvme_write_policy = kv.second.as<std::string>();
      } else if (key == "dram_eviction" || key == "hbm_eviction" || key == "nvme_eviction") {
        expected = "lru, s3fifo or arc";
        *dst->Eviction(key) = kv.second.as<std::string>();
      } else if (key == "selective_min_hits") {
        expected = "an integer";
        dst->selective_min_hits = kv.second.as<int64_t>();
      } else if (key == "nvme_queue_depth") {
        expected = "an integer";
        dst->nvme_queue_depth = kv.second.as<int64_t>();
      } else if (key == "nvme_workers") {
        expected = "an integer";
        dst->nvme_workers = kv.second.as<int64_t>();
      } else if (key == "remote") {
        expected = "a URL such as redis://host:6379,host2:6379";
        dst->remote = kv.second.as<std::string>();
      } else if (key == "remote_key_file") {
        expected = "a file path";
        dst->remote_key_file = kv.second.as<std::string>();
      } else if (key == "remote_pool_size" || key == "remote_timeout_ms") {
        expected = "an integer";
        (key == "remote_pool_size" ? dst->remote_pool_size : dst->remote_timeout_ms) =
            kv.second.as<int64_t>();
      } else if (key == "hbm_bytes") {
        expected = "a byte size such as 16GiB";
        dst->hbm_bytes = kv.second.as<std::string>();
      } else if (key == "gpu") {
        expected = "a CUDA device ordinal";
        dst->gpu = kv.second.as<int64_t>();
      } else if (key == "gpu_backend") {
        expected = "cuda or host";
        dst->gpu_backend = kv.second.as<std::string>();
      } else if (key == "lease_ttl_ms" || key == "reservation_ttl_ms" ||
                 key == "drain_timeout_ms") {
        expected = "an integer number of milliseconds";
        (key == "lease_ttl_ms"         ? dst->lease_ttl_ms
         : key == "reservation_ttl_ms" ? dst->reservation_ttl_ms
                                       : dst->drain_timeout_ms) = kv.second.as<int64_t>();
      } else {
        return ConfigError(path, line,
                           "unknown key '" + key +
                               "' (socket, socket_group, metrics_address, events_address, "
                               "events_replay_address, log_level, "
                               "dram_bytes, session_max_bytes, lease_ttl_ms, "
                               "reservation_ttl_ms, "
                               "drain_timeout_ms, nvme_paths, nvme_bytes, "
                               "nvme_queue_depth, nvme_workers, nvme_write_policy, "
                               "selective_min_hits, hbm_bytes, gpu, gpu_backend, "
                               "dram_eviction, hbm_eviction, nvme_eviction, remote, "
                               "remote_pool_size, remote_timeout_ms, remote_key_file)");
      }
    } catch (const YAML::Exception& e) {
      return ConfigError(path, e.mark.is_null() ? line : e.mark.line + 1,
                         "key '" + key + "' must be " + expected);
    }
  }
  for (const auto& [key, line] : overridden.from_config) {
    if (raw->overridden_error.ok()) raw->overridden_error = CheckForm(key, overridden);
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
  app.add_option("--socket", raw.socket, "gRPC Unix socket path")->capture_default_str();
  app.add_option("--socket-group", raw.socket_group,
                 "group allowed to connect (directory 0750, socket 0660)");
  app.add_option("--dram-bytes", raw.dram_bytes,
                 "DRAM arena size, e.g. 512MiB, 4GiB (a multiple of 4 KiB)")
      ->capture_default_str();
  app.add_option("--session-max-bytes", raw.session_max_bytes,
                 "most DRAM one client session may hold at once in leases, prefetches and "
                 "reservations; 0 = half of --dram-bytes")
      ->capture_default_str();
  app.add_option("--metrics-address", raw.metrics_address,
                 "Prometheus /metrics over HTTP: HOST:PORT ([::1]:PORT for IPv6; port 0: any "
                 "free one), or off")
      ->capture_default_str();
  app.add_option("--events-address", raw.events_address,
                 "publish KV events (vLLM's schema, msgpack over ZMQ PUB) on this endpoint: "
                 "tcp://HOST:PORT or ipc://PATH. Default: off");
  app.add_option("--events-replay-address", raw.events_replay_address,
                 "serve the last 10,000 event batches for replay (ZMQ ROUTER) on this endpoint");
  app.add_option("--log-level", raw.log_level, "trace|debug|info|warn|error|critical|off")
      ->capture_default_str();
  app.add_option("--lease-ttl-ms", raw.lease_ttl_ms, "a read lease ends by itself after this")
      ->capture_default_str();
  app.add_option("--reservation-ttl-ms", raw.reservation_ttl_ms,
                 "an uncommitted write is freed after this")
      ->capture_default_str();
  app.add_option("--drain-timeout-ms", raw.drain_timeout_ms,
                 "at shutdown, how long pending NVMe writes may take before kvtierd stops "
                 "without them (a second SIGTERM/SIGINT stops at once)")
      ->capture_default_str();
  app.add_option("--nvme-path", raw.nvme_paths,
                 "directory for an NVMe slot file (repeatable; it must exist). Default: "
                 "./kvtier-data, created when missing");
  app.add_option("--nvme-bytes", raw.nvme_bytes,
                 "size of the slot file in each --nvme-path; 0 turns the NVMe tier off")
      ->capture_default_str();
  app.add_option("--nvme-queue-depth", raw.nvme_queue_depth, "io_uring queue depth per I/O thread")
      ->capture_default_str();
  app.add_option("--nvme-workers", raw.nvme_workers,
                 "threads reading NVMe for promotion and prefetch, one io_uring each")
      ->capture_default_str();
  app.add_option("--nvme-write-policy", raw.nvme_write_policy,
                 "write_through (every committed chunk), write_back (when DRAM evicts it) or "
                 "selective (after N hits)")
      ->capture_default_str();
  for (auto [flag, value, tier] : {std::tuple{"--dram-eviction", &raw.dram_eviction, "DRAM"},
                                   std::tuple{"--hbm-eviction", &raw.hbm_eviction, "HBM"},
                                   std::tuple{"--nvme-eviction", &raw.nvme_eviction, "NVMe"}}) {
    app.add_option(flag, *value,
                   std::string("which chunk the ") + tier +
                       " tier evicts when full: lru "
                       "(leaf-first least recently used), s3fifo (leaf-first S3-FIFO) or arc "
                       "(leaf-first ARC)")
        ->capture_default_str();
  }
  app.add_option("--selective-min-hits", raw.selective_min_hits,
                 "hits before a chunk goes to NVMe under the selective policy")
      ->capture_default_str();
  app.add_option("--hbm-bytes", raw.hbm_bytes,
                 "HBM tier: a device pool of this size on --gpu, shared with clients over CUDA "
                 "IPC (it competes with the engine's own KV memory); 0 = off")
      ->capture_default_str();
  app.add_option("--gpu", raw.gpu, "CUDA device ordinal of the HBM pool")->capture_default_str();
  app.add_option("--gpu-backend", raw.gpu_backend,
                 "cuda, or host: emulate the GPU with shared host memory (tests only)")
      ->capture_default_str();
  app.add_option("--remote", raw.remote,
                 "remote tier shared by many kvtierd: redis://host:port[,host:port...] (a Redis "
                 "Cluster's seeds, or one Redis/Valkey server; port 6379 when left out); needs "
                 "the NVMe tier. Default: off");
  app.add_option("--remote-pool-size", raw.remote_pool_size,
                 "connections kept per remote store node")
      ->capture_default_str();
  app.add_option("--remote-timeout-ms", raw.remote_timeout_ms,
                 "longest wait for one remote store node's answers to a batch; past it, a miss")
      ->capture_default_str();
  app.add_option("--remote-key-file", raw.remote_key_file,
                 "the remote images' MAC key, shared by the store's kvtierd: a file of 32 bytes "
                 "(raw, or 64 hex digits), mode 0600. Without it the store must be trusted: "
                 "whoever can write to it can plant images. Default: none");
  bool rebuild_index = false;
  app.add_flag("--rebuild-index", rebuild_index,
               "rebuild the NVMe index from the slot headers before serving");
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

  auto dram = ParseBytes(raw.dram_bytes);
  if (!dram.ok()) {
    return Status::InvalidArgument(raw.Where("dram_bytes") + ": " + dram.status().message());
  }
  opts.socket_path = raw.socket;
  KVTIER_RETURN_IF_ERROR(CheckForm("metrics_address", raw));
  opts.metrics_address = raw.metrics_address;
  const CLI::Option* metrics_flag = app.get_option_no_throw("--metrics-address");
  opts.metrics_default = raw.from_config.count("metrics_address") == 0 &&
                         (metrics_flag == nullptr || metrics_flag->count() == 0);
  for (const char* key : {"events_address", "events_replay_address"}) {
    KVTIER_RETURN_IF_ERROR(CheckForm(key, raw));
  }
  if (raw.events_address.empty() && !raw.events_replay_address.empty()) {
    return Status::InvalidArgument(raw.Where("events_replay_address") +
                                   " needs --events-address (events are off without it)");
  }
  opts.events_address = raw.events_address;
  opts.events_replay_address = raw.events_replay_address;
  opts.socket_group = raw.socket_group;
  opts.log_level = raw.log_level;
  KVTIER_RETURN_IF_ERROR(CheckDramFitsMemory(*dram, raw.Where("dram_bytes")));
  opts.core.dram_bytes = *dram;
  EvictionPolicyKind eviction[3];
  for (int i = 0; const char* key : {"dram_eviction", "hbm_eviction", "nvme_eviction"}) {
    KVTIER_RETURN_IF_ERROR(CheckForm(key, raw));
    eviction[i++] = *ParseEvictionPolicy(*raw.Eviction(key));
  }
  opts.core.dram_eviction = eviction[0];
  opts.core.hbm.eviction = eviction[1];
  opts.core.nvme.eviction = eviction[2];
  auto session_max = ParseBytes(raw.session_max_bytes);
  if (!session_max.ok()) {
    return Status::InvalidArgument(raw.Where("session_max_bytes") + ": " +
                                   session_max.status().message());
  }
  opts.core.session_max_bytes = *session_max;
  opts.core.lease_ttl = std::chrono::milliseconds(raw.lease_ttl_ms);
  if (raw.drain_timeout_ms < 0 || raw.drain_timeout_ms > 3'600'000) {
    return Status::InvalidArgument(raw.Where("drain_timeout_ms") + " " +
                                   std::to_string(raw.drain_timeout_ms) +
                                   " is outside 0..3600000 (1 hour)");
  }
  opts.drain_timeout = std::chrono::milliseconds(raw.drain_timeout_ms);
  auto nvme_bytes = ParseBytes(raw.nvme_bytes);
  if (!nvme_bytes.ok()) {
    return Status::InvalidArgument(raw.Where("nvme_bytes") + ": " + nvme_bytes.status().message());
  }
  // Checked whether the tier is on or not: a typo is an error either way.
  if (*nvme_bytes % 4096 != 0) {
    return Status::InvalidArgument(raw.Where("nvme_bytes") + " " + std::to_string(*nvme_bytes) +
                                   " is not a multiple of 4096");
  }
  if (raw.nvme_queue_depth < 1 || raw.nvme_queue_depth > 4096) {
    return Status::InvalidArgument(raw.Where("nvme_queue_depth") + " " +
                                   std::to_string(raw.nvme_queue_depth) + " is outside 1..4096");
  }
  if (raw.nvme_workers < 1 || raw.nvme_workers > 64) {
    return Status::InvalidArgument(raw.Where("nvme_workers") + " " +
                                   std::to_string(raw.nvme_workers) + " is outside 1..64");
  }
  auto policy = ParseNvmeWritePolicy(raw.nvme_write_policy);
  if (!policy.ok()) return raw.Named(policy.status());
  if (raw.selective_min_hits < 1 || raw.selective_min_hits > 1000000) {
    return Status::InvalidArgument(raw.Where("selective_min_hits") + " " +
                                   std::to_string(raw.selective_min_hits) +
                                   " is outside 1..1000000");
  }
  for (const std::string& p : raw.nvme_paths) {  // "" would be the working directory
    if (p.empty()) {
      return Status::InvalidArgument(raw.Where("nvme_paths") +
                                     " gives an empty path: name a directory");
    }
  }
  // A setting given by flag or config that the tiers on leave unused: logged at start.
  const auto ignore_if_given = [&](const std::string& key, const std::string& off_key,
                                   const std::string& why) {
    const CLI::Option* flag = app.get_option_no_throw(DaemonOptions::FlagOf(key));
    if ((flag == nullptr || flag->count() == 0) && raw.from_config.count(key) == 0) return;
    const bool same_file = raw.from_config.count(key) > 0 && raw.from_config.count(off_key) > 0;
    opts.ignored.push_back(raw.Where(key) +
                           " has no effect: " + (same_file ? off_key : raw.Where(off_key)) + why);
  };
  const CLI::Option* bytes_flag = app.get_option_no_throw("--nvme-bytes");
  if (*nvme_bytes == 0 && raw.nvme_paths_from_config && bytes_flag != nullptr &&
      bytes_flag->count() > 0) {
    ignore_if_given("nvme_paths", "nvme_bytes", " 0 turns the NVMe tier off");
    raw.nvme_paths.clear();  // the flag wins over the file
  }
  if (*nvme_bytes == 0) {  // DRAM only
    if (!raw.nvme_paths.empty()) {
      return Status::InvalidArgument(raw.Where("nvme_bytes") + " 0 turns the NVMe tier off, but " +
                                     raw.Where("nvme_paths") +
                                     " gives paths: drop them or give "
                                     "a size");
    }
    if (rebuild_index) {
      return Status::InvalidArgument("--rebuild-index needs the NVMe tier (nvme_bytes is 0)");
    }
    for (const std::string key :
         {"nvme_write_policy", "selective_min_hits", "nvme_queue_depth", "nvme_eviction"}) {
      ignore_if_given(key, "nvme_bytes", " 0 turns the NVMe tier off");
    }
  } else {
    opts.nvme_default_path = raw.nvme_paths.empty();
    opts.core.nvme_workers = static_cast<uint32_t>(raw.nvme_workers);
    opts.core.nvme_write_policy = *policy;
    opts.core.selective_min_hits = static_cast<uint32_t>(raw.selective_min_hits);
    opts.core.nvme.paths =
        raw.nvme_paths.empty() ? std::vector<std::string>{kDefaultNvmePath} : raw.nvme_paths;
    opts.core.nvme.bytes_per_path = *nvme_bytes;
    opts.core.nvme.queue_depth = static_cast<uint32_t>(raw.nvme_queue_depth);
  }
  auto hbm_bytes = ParseBytes(raw.hbm_bytes);
  if (!hbm_bytes.ok()) {
    return Status::InvalidArgument(raw.Where("hbm_bytes") + ": " + hbm_bytes.status().message());
  }
  if (*hbm_bytes % 4096 != 0) {
    return Status::InvalidArgument(raw.Where("hbm_bytes") + " " + std::to_string(*hbm_bytes) +
                                   " is not a multiple of 4096");
  }
  if (raw.gpu < 0 || raw.gpu > 1023) {
    return Status::InvalidArgument(raw.Where("gpu") + " " + std::to_string(raw.gpu) +
                                   " is outside 0..1023");
  }
  auto backend = ParseHbmBackend(raw.gpu_backend);
  if (!backend.ok()) return raw.Named(backend.status());
  opts.core.hbm.bytes = *hbm_bytes;
  opts.core.hbm.device = static_cast<int>(raw.gpu);
  opts.core.hbm.backend = *backend;
  if (*hbm_bytes > 0) opts.core.nvme_workers = static_cast<uint32_t>(raw.nvme_workers);
  if (*hbm_bytes == 0) ignore_if_given("hbm_eviction", "hbm_bytes", " 0 turns the HBM tier off");
  if (*nvme_bytes == 0 && *hbm_bytes == 0) {  // the I/O workers serve NVMe and HBM copies
    ignore_if_given("nvme_workers", "nvme_bytes", " 0 and hbm_bytes 0 leave the I/O workers idle");
  }
  const CLI::Option* remote_flag = app.get_option_no_throw("--remote");
  KVTIER_RETURN_IF_ERROR(ApplyRemote(
      raw, *nvme_bytes,
      (remote_flag != nullptr && remote_flag->count() > 0) || raw.from_config.count("remote") > 0,
      ignore_if_given, &opts));
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
  opts.rebuild_index = rebuild_index;
  opts.core.reservation_ttl = std::chrono::milliseconds(raw.reservation_ttl_ms);
  if (Status st = opts.Validate(); !st.ok()) return raw.Named(st);
  KVTIER_RETURN_IF_ERROR(CheckForm("log_level", raw));
  KVTIER_RETURN_IF_ERROR(raw.overridden_error);
  return opts;
}

}  // namespace kvtier
