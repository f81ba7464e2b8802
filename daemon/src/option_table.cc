// kvtierd's settings table (option_table.h).
#include "option_table.h"

#include <string>

namespace kvtier {
namespace {

std::string Ms(std::chrono::milliseconds d) { return std::to_string(d.count()); }

// kvtierd --help for a tier's eviction policy.
#define KVTIER_EVICTION_HELP(tier)                                 \
  "which chunk the " tier                                          \
  " tier evicts when full: lru (leaf-first least recently used), " \
  "s3fifo (leaf-first S3-FIFO) or arc (leaf-first ARC)"
constexpr const char* kEvictionExpected = "lru, s3fifo or arc";
constexpr const char* kInteger = "an integer";

const OptionSpec kOptions[] = {
    {.key = "socket",
     .field = &RawOptions::socket,
     .help = "gRPC Unix socket path",
     .expected = "a string",
     .effective = [](const DaemonOptions& o) { return o.socket_path; }},
    {.key = "socket_group",
     .field = &RawOptions::socket_group,
     .help = "group allowed to connect (directory 0750, socket 0660)",
     .expected = "a string",
     .no_default = true,
     .effective = [](const DaemonOptions& o) { return o.socket_group; }},
    {.key = "dram_bytes",
     .field = &RawOptions::dram_bytes,
     .help = "DRAM arena size, e.g. 512MiB, 4GiB (a multiple of 4 KiB)",
     .expected = "a byte size such as 4GiB",
     .effective = [](const DaemonOptions& o) { return std::to_string(o.core.dram_bytes); }},
    {.key = "session_max_bytes",
     .field = &RawOptions::session_max_bytes,
     .help = "most DRAM one client session may hold at once in leases, prefetches and "
             "reservations; 0 = half of --dram-bytes",
     .expected = "a byte size such as 1GiB",
     .effective = [](const DaemonOptions& o) { return std::to_string(o.core.SessionMaxBytes()); }},
    {.key = "metrics_address",
     .field = &RawOptions::metrics_address,
     .help = "Prometheus /metrics over HTTP: HOST:PORT ([::1]:PORT for IPv6; port 0: any free "
             "one), or off",
     .expected = "a string",
     .effective = [](const DaemonOptions& o) { return o.metrics_address; }},
    {.key = "events_address",
     .field = &RawOptions::events_address,
     .help = "publish KV events (vLLM's schema, msgpack over ZMQ PUB) on this endpoint: "
             "tcp://HOST:PORT or ipc://PATH. Default: off",
     .expected = "a string",
     .no_default = true,
     .effective = [](const DaemonOptions& o) { return o.events_address; }},
    {.key = "events_replay_address",
     .field = &RawOptions::events_replay_address,
     .help = "serve the last 10,000 event batches for replay (ZMQ ROUTER) on this endpoint",
     .expected = "a string",
     .no_default = true,
     .effective = [](const DaemonOptions& o) { return o.events_replay_address; }},
    {.key = "log_level",
     .field = &RawOptions::log_level,
     .help = "trace|debug|info|warn|error|critical|off",
     .expected = "a string",
     .effective = [](const DaemonOptions& o) { return o.log_level; }},
    {.key = "lease_ttl_ms",
     .field = &RawOptions::lease_ttl_ms,
     .help = "a read lease ends by itself after this",
     .expected = "an integer number of milliseconds",
     .min = 100,
     .max = 86'400'000,
     .range_note = " (100 ms to 24 h)",
     .effective = [](const DaemonOptions& o) { return Ms(o.core.lease_ttl); }},
    {.key = "reservation_ttl_ms",
     .field = &RawOptions::reservation_ttl_ms,
     .help = "an uncommitted write is freed after this",
     .expected = "an integer number of milliseconds",
     .min = 100,
     .max = 86'400'000,
     .range_note = " (100 ms to 24 h)",
     .effective = [](const DaemonOptions& o) { return Ms(o.core.reservation_ttl); }},
    {.key = "drain_timeout_ms",
     .field = &RawOptions::drain_timeout_ms,
     .help = "at shutdown, how long pending NVMe writes may take before kvtierd stops without "
             "them (a second SIGTERM/SIGINT stops at once)",
     .expected = "an integer number of milliseconds",
     .min = 0,
     .max = 3'600'000,
     .range_note = " (1 hour)",
     .effective = [](const DaemonOptions& o) { return Ms(o.drain_timeout); }},
    {.key = "nvme_paths",
     .field = &RawOptions::nvme_paths,
     .help = "directory for an NVMe slot file (repeatable; it must exist). Default: "
             "./kvtier-data, created when missing",
     .expected = "a directory or a list of directories",
     .no_default = true,
     .effective =
         [](const DaemonOptions& o) {
           std::string paths;
           for (const std::string& p : o.core.nvme.paths) {
             paths += (paths.empty() ? "" : ",") + p;
           }
           return paths;
         }},
    {.key = "nvme_bytes",
     .field = &RawOptions::nvme_bytes,
     .help = "size of the slot file in each --nvme-path; 0 turns the NVMe tier off",
     .expected = "a byte size such as 64GiB",
     .effective =
         [](const DaemonOptions& o) {
           return std::to_string(o.core.nvme.paths.empty() ? 0 : o.core.nvme.bytes_per_path);
         }},
    {.key = "nvme_queue_depth",
     .field = &RawOptions::nvme_queue_depth,
     .help = "io_uring queue depth per I/O thread",
     .expected = kInteger,
     .min = 1,
     .max = 4096,
     .effective = [](const DaemonOptions& o) { return std::to_string(o.core.nvme.queue_depth); }},
    {.key = "nvme_workers",
     .field = &RawOptions::nvme_workers,
     .help = "threads reading NVMe for promotion and prefetch, one io_uring each",
     .expected = kInteger,
     .min = 1,
     .max = 64,
     .effective = [](const DaemonOptions& o) { return std::to_string(o.core.nvme_workers); }},
    {.key = "nvme_write_policy",
     .field = &RawOptions::nvme_write_policy,
     .help = "write_through (every committed chunk), write_back (when DRAM evicts it) or "
             "selective (after N hits)",
     .expected = "write_through, write_back or selective",
     .effective =
         [](const DaemonOptions& o) {
           const NvmeWritePolicy p = o.core.nvme_write_policy;
           return std::string(p == NvmeWritePolicy::kWriteBack   ? "write_back"
                              : p == NvmeWritePolicy::kSelective ? "selective"
                                                                 : "write_through");
         }},
    {.key = "dram_eviction",
     .field = &RawOptions::dram_eviction,
     .help = KVTIER_EVICTION_HELP("DRAM"),
     .expected = kEvictionExpected,
     .effective =
         [](const DaemonOptions& o) {
           return std::string(EvictionPolicyName(o.core.dram_eviction));
         }},
    {.key = "hbm_eviction",
     .field = &RawOptions::hbm_eviction,
     .help = KVTIER_EVICTION_HELP("HBM"),
     .expected = kEvictionExpected,
     .effective =
         [](const DaemonOptions& o) {
           return std::string(EvictionPolicyName(o.core.hbm.eviction));
         }},
    {.key = "nvme_eviction",
     .field = &RawOptions::nvme_eviction,
     .help = KVTIER_EVICTION_HELP("NVMe"),
     .expected = kEvictionExpected,
     .effective =
         [](const DaemonOptions& o) {
           return std::string(EvictionPolicyName(o.core.nvme.eviction));
         }},
    {.key = "selective_min_hits",
     .field = &RawOptions::selective_min_hits,
     .help = "hits before a chunk goes to NVMe under the selective policy",
     .expected = kInteger,
     .min = 1,
     .max = 1'000'000,
     .effective = [](const DaemonOptions& o) { return std::to_string(o.core.selective_min_hits); }},
    {.key = "hbm_bytes",
     .field = &RawOptions::hbm_bytes,
     .help = "HBM tier: a device pool of this size on --gpu, shared with clients over CUDA IPC "
             "(it competes with the engine's own KV memory); 0 = off",
     .expected = "a byte size such as 16GiB",
     .effective = [](const DaemonOptions& o) { return std::to_string(o.core.hbm.bytes); }},
    {.key = "gpu",
     .field = &RawOptions::gpu,
     .help = "CUDA device ordinal of the HBM pool",
     .expected = "a CUDA device ordinal",
     .min = 0,
     .max = 1023,
     .effective = [](const DaemonOptions& o) { return std::to_string(o.core.hbm.device); }},
    {.key = "gpu_backend",
     .field = &RawOptions::gpu_backend,
     .help = "cuda, or host: emulate the GPU with shared host memory (tests only)",
     .expected = "cuda or host",
     .effective =
         [](const DaemonOptions& o) {
           return std::string(o.core.hbm.backend == HbmBackend::kHost ? "host" : "cuda");
         }},
    {.key = "remote",
     .field = &RawOptions::remote,
     .help = "remote tier shared by many kvtierd: redis://host:port[,host:port...] (a Redis "
             "Cluster's seeds, or one Redis/Valkey server; port 6379 when left out); needs the "
             "NVMe tier. Default: off",
     .expected = "a URL such as redis://host:6379,host2:6379",
     .no_default = true,
     .effective = [](const DaemonOptions& o) { return o.core.remote.url; }},
    {.key = "remote_pool_size",
     .field = &RawOptions::remote_pool_size,
     .help = "connections kept per remote store node",
     .expected = kInteger,
     .min = 1,
     .max = 256,
     .effective = [](const DaemonOptions& o) { return std::to_string(o.core.remote.pool_size); }},
    {.key = "remote_timeout_ms",
     .field = &RawOptions::remote_timeout_ms,
     .help = "longest wait for one remote store node's answers to a batch; past it, a miss",
     .expected = kInteger,
     .min = 1,
     .max = 60'000,
     .effective = [](const DaemonOptions& o) { return Ms(o.core.remote.timeout); }},
    {.key = "remote_key_file",
     .field = &RawOptions::remote_key_file,
     .help = "the remote images' MAC key, shared by the store's kvtierd: a file of 32 bytes "
             "(raw, or 64 hex digits), mode 0600. Without it the store must be trusted: whoever "
             "can write to it can plant images. Default: none",
     .expected = "a file path",
     .no_default = true,
     .effective = [](const DaemonOptions& o) { return o.remote_key_file; }},
    {.key = "rebuild_index",
     .field = &RawOptions::rebuild_index,
     .help = "rebuild the NVMe index from the slot headers before serving",
     .expected = "",
     .flag_only = true,
     .effective =
         [](const DaemonOptions& o) { return std::string(o.rebuild_index ? "true" : "false"); }},
};

#undef KVTIER_EVICTION_HELP

}  // namespace

std::span<const OptionSpec> OptionTable() { return kOptions; }

const OptionSpec* FindOption(std::string_view key) {
  for (const OptionSpec& o : kOptions) {
    if (!o.flag_only && key == o.key) return &o;
  }
  return nullptr;
}

std::string OptionKeys() {
  std::string keys;
  for (const OptionSpec& o : kOptions) {
    if (!o.flag_only) keys += (keys.empty() ? "" : ", ") + std::string(o.key);
  }
  return keys;
}

std::string RawOptions::Where(const std::string& key) const {
  const auto line = from_config.find(key);
  if (line == from_config.end()) return DaemonOptions::FlagOf(key);
  return "config " + config_path + ":" + std::to_string(line->second) + ": " + key;
}

Status RawOptions::Named(const Status& st) const {
  const std::string& m = st.message();
  for (const OptionSpec& o : kOptions) {
    const std::string_view key = o.key;
    if (m.size() > key.size() && m.rfind(key, 0) == 0 &&
        (m[key.size()] == ' ' || m[key.size()] == ':')) {
      return Status(st.code(), Where(std::string(key)) + m.substr(key.size()));
    }
  }
  return st;
}

}  // namespace kvtier
