// EffectiveConfig: kvtierd's options as it runs them (kvtierctl config).
#include <string>
#include <vector>

#include "kvtier/daemon/daemon_options.h"
#include "option_table.h"

namespace kvtier {

std::vector<ConfigSetting> EffectiveConfig(const DaemonOptions& o) {
  const CacheCoreOptions& c = o.core;
  auto ms = [](std::chrono::milliseconds d) { return std::to_string(d.count()); };
  std::vector<ConfigSetting> out;
  for (const OptionSpec& spec : OptionTable()) {  // in the order of kvtierd --help
    std::string source = "default";
    if (o.from_flags.contains(spec.key)) {
      source = "flag";
    } else if (auto it = o.from_config.find(spec.key); it != o.from_config.end()) {
      source = it->second;
    }
    out.push_back({spec.key, spec.effective(o), source});
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
