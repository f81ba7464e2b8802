// kvtierctl namespaces, ls (a namespace's chunks, or a prompt prefix's) and config.
#include <cstdio>

#include "ctl.h"
#include "kvtier/tools/table_cell.h"
#include "kvtier/units.h"

namespace kvtier::ctl {

using nlohmann::json;
using tools::Cell;

int RunNamespaces(AdminClient& admin, const std::string& socket_path, bool as_json) {
  auto list = admin.Namespaces();
  if (!list.ok()) return Fail(socket_path, as_json, list.status());
  if (as_json) {
    json arr = json::array();
    for (const auto& n : *list) {
      const auto& s = n.spec;
      arr.push_back({{"namespace_id", n.id.ToHex()},
                     {"model_id", s.model_id},
                     {"lora_id", s.lora_id},
                     {"kv_dtype", s.kv_dtype},
                     {"layout", s.layout},
                     {"num_layers", s.num_layers},
                     {"num_kv_heads", s.num_kv_heads},
                     {"head_dim", s.head_dim},
                     {"latent_dim", s.latent_dim},
                     {"chunk_tokens", s.chunk_tokens},
                     {"tp_rank", s.tp_rank},
                     {"tp_size", s.tp_size},
                     {"cache_salt", s.cache_salt.empty() ? "" : "(set)"},
                     {"chunks", n.chunks},
                     {"slot_bytes", n.slot_bytes}});
    }
    std::printf("%s\n", json{{"namespaces", arr}}.dump(2).c_str());
  } else {
    // Two namespaces of one model differ by LoRA adapter or salt (the salt itself is secret).
    std::printf("%-32s %s %s %-4s %-8s %-4s %6s %6s %6s %6s %5s %10s %10s\n", "namespace_id",
                Cell("model", 28).c_str(), Cell("lora", 16).c_str(), "salt", "dtype", "lay",
                "layers", "heads", "dim", "chunk", "tp", "chunks", "slot");
    for (const auto& n : *list) {
      const auto& s = n.spec;
      std::printf(
          "%-32s %s %s %-4s %-8s %-4s %6u %6u %6u %6u %2u/%-2u %10llu %10s\n", n.id.ToHex().c_str(),
          Cell(s.model_id, 28).c_str(), Cell(s.lora_id.empty() ? "-" : s.lora_id, 16).c_str(),
          s.cache_salt.empty() ? "-" : "set", s.kv_dtype.c_str(), s.layout.c_str(), s.num_layers,
          s.num_kv_heads, s.layout == "mla" ? s.latent_dim : s.head_dim, s.chunk_tokens, s.tp_rank,
          s.tp_size, static_cast<unsigned long long>(n.chunks), FormatBytes(n.slot_bytes).c_str());
    }
  }
  return 0;
}

int RunLs(AdminClient& admin, const std::string& socket_path, bool as_json, const NamespaceId& ns,
          const std::vector<int32_t>& tokens, uint32_t limit) {
  auto list = admin.ListChunks(ns, tokens, limit);
  if (!list.ok()) return Fail(socket_path, as_json, list.status());
  auto tiers_text = [](const ChunkInfo& c) {
    std::string t;
    for (const std::string& n : c.tiers) t += (t.empty() ? "" : ",") + n;
    return t;
  };
  if (as_json) {
    json arr = json::array();
    for (const ChunkInfo& c : list->chunks) {
      arr.push_back({{"key", c.key.ToHex()},
                     {"tiers", c.tiers},
                     {"payload_bytes", c.payload_bytes},
                     {"slot_bytes", c.slot_bytes},
                     {"age_s", c.age_s ? json(*c.age_s) : json(nullptr)},
                     {"hits", c.hits},
                     {"pinned", c.pinned}});
    }
    std::printf("%s\n",
                json{{"namespace_id", ns.ToHex()}, {"chunks", arr}, {"left_out", list->left_out}}
                    .dump(2)
                    .c_str());
    return 0;
  }
  std::printf("%-32s %-14s %10s %10s %8s %8s %6s\n", "key", "tiers", "bytes", "slot", "age_s",
              "hits", "pinned");
  for (const ChunkInfo& c : list->chunks) {
    std::printf("%-32s %-14s %10llu %10s %8s %8u %6s\n", c.key.ToHex().c_str(),
                tiers_text(c).c_str(), static_cast<unsigned long long>(c.payload_bytes),
                FormatBytes(c.slot_bytes).c_str(), c.age_s ? std::to_string(*c.age_s).c_str() : "-",
                c.hits, c.pinned ? "yes" : "no");
  }
  if (list->chunks.empty()) {
    std::printf(tokens.empty() ? "no chunk of this namespace is cached\n"
                               : "no chunk of this prompt is cached\n");
  }
  if (list->left_out > 0) {
    std::printf("%llu more chunks not listed (at most %u: give a larger --limit)\n",
                static_cast<unsigned long long>(list->left_out), limit);
  }
  return 0;
}

int RunConfig(AdminClient& admin, const std::string& socket_path, bool as_json) {
  auto settings = admin.Config();
  if (!settings.ok()) return Fail(socket_path, as_json, settings.status());
  if (as_json) {
    json values = json::object(), sources = json::object();
    for (const DaemonSetting& s : *settings) {
      values[s.key] = s.value;
      sources[s.key] = s.source;
    }
    std::printf("%s\n", json{{"config", values}, {"sources", sources}}.dump(2).c_str());
    return 0;
  }
  // YAML a config file could hold (values quoted where YAML would misread them).
  for (const DaemonSetting& s : *settings) {
    const bool plain =
        !s.value.empty() && s.value.find_first_of(":#,[]{}&*!|>'\"%@` ") == std::string::npos;
    std::printf("%s: %s  # %s\n", s.key.c_str(),
                plain ? s.value.c_str() : json(s.value).dump().c_str(), s.source.c_str());
  }
  return 0;
}

}  // namespace kvtier::ctl
