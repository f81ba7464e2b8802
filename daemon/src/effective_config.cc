// EffectiveConfig: kvtierd's options as it runs them (kvtierctl config).
#include <string>
#include <vector>

#include "kvtier/daemon/daemon_options.h"

namespace kvtier {

std::vector<ConfigSetting> EffectiveConfig(const DaemonOptions& o) {
  const CacheCoreOptions& c = o.core;
  const bool nvme = !c.nvme.paths.empty();
  std::string paths;
  for (const std::string& p : c.nvme.paths) paths += (paths.empty() ? "" : ",") + p;
  const char* policy = c.nvme_write_policy == NvmeWritePolicy::kWriteBack   ? "write_back"
                       : c.nvme_write_policy == NvmeWritePolicy::kSelective ? "selective"
                                                                            : "write_through";
  auto ms = [](std::chrono::milliseconds d) { return std::to_string(d.count()); };
  // The options flags and config keys set, in the order of kvtierd --help.
  const std::vector<std::pair<std::string, std::string>> flagged = {
      {"socket", o.socket_path},
      {"socket_group", o.socket_group},
      {"dram_bytes", std::to_string(c.dram_bytes)},
      {"session_max_bytes", std::to_string(c.SessionMaxBytes())},
      {"metrics_address", o.metrics_address},
      {"events_address", o.events_address},
      {"events_replay_address", o.events_replay_address},
      {"log_level", o.log_level},
      {"lease_ttl_ms", ms(c.lease_ttl)},
      {"reservation_ttl_ms", ms(c.reservation_ttl)},
      {"drain_timeout_ms", ms(o.drain_timeout)},
      {"nvme_paths", paths},
      {"nvme_bytes", std::to_string(nvme ? c.nvme.bytes_per_path : 0)},
      {"nvme_queue_depth", std::to_string(c.nvme.queue_depth)},
      {"nvme_workers", std::to_string(c.nvme_workers)},
      {"nvme_write_policy", policy},
      {"selective_min_hits", std::to_string(c.selective_min_hits)},
      {"dram_eviction", EvictionPolicyName(c.dram_eviction)},
      {"hbm_eviction", EvictionPolicyName(c.hbm.eviction)},
      {"nvme_eviction", EvictionPolicyName(c.nvme.eviction)},
      {"hbm_bytes", std::to_string(c.hbm.bytes)},
      {"gpu", std::to_string(c.hbm.device)},
      {"remote", c.remote.url},
      {"remote_pool_size", std::to_string(c.remote.pool_size)},
      {"remote_timeout_ms", ms(c.remote.timeout)},
      {"remote_key_file", o.remote_key_file},
      {"gpu_backend", c.hbm.backend == HbmBackend::kHost ? "host" : "cuda"},
      {"rebuild_index", o.rebuild_index ? "true" : "false"},
  };
  std::vector<ConfigSetting> out;
  for (const auto& [key, value] : flagged) {
    std::string source = "default";
    if (o.from_flags.contains(key)) {
      source = "flag";
    } else if (auto it = o.from_config.find(key); it != o.from_config.end()) {
      source = it->second;
    }
    out.push_back({key, value, source});
  }
  // CacheCoreOptions that no flag or key sets.
  out.push_back({"max_prompt_tokens", std::to_string(c.max_prompt_tokens), "built-in"});
  out.push_back({"max_chunks_per_request", std::to_string(c.max_chunks_per_request), "built-in"});
  out.push_back({"max_namespaces", std::to_string(c.max_namespaces), "built-in"});
  out.push_back({"write_back_buffer_bytes", std::to_string(c.write_back_buffer_bytes), "built-in"});
  out.push_back({"write_through_wait_ms", ms(c.write_through_wait), "built-in"});
  return out;
}

}  // namespace kvtier
