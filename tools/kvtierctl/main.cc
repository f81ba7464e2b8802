// kvtierctl: the admin CLI of kvtierd.
//   kvtierctl [--socket PATH] [--json] stats | health | namespaces
//   kvtierctl evict (--all | --namespace ID [--tokens 1,2,3 | --tokens-file F.json])
// Human tables by default, --json for scripts. Exit codes: 0 OK (health:
// serving), 1 daemon unreachable or not serving, 2 usage error.
#include <charconv>
#include <CLI/CLI.hpp>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kvtier/logging.h"
#include "kvtier/admin_client.h"
#include "kvtier/socket_path.h"
#include "kvtier/tools/cli_words.h"
#include "kvtier/tools/table_cell.h"
#include "kvtier/units.h"

namespace {

using nlohmann::json;
using kvtier::tools::Cell;

json StatsJson(const kvtier::DaemonStats& s) {
  json tiers = json::array();
  for (const auto& t : s.tiers) {
    tiers.push_back({{"name", t.name},
                     {"capacity_bytes", t.capacity_bytes},
                     {"used_bytes", t.used_bytes},
                     {"capacity_chunks", t.capacity_chunks},
                     {"chunks", t.chunks},
                     {"hits", t.hits},
                     {"misses", t.misses},
                     {"evictions", t.evictions},
                     {"read_bytes", t.read_bytes},
                     {"write_bytes", t.write_bytes},
                     {"pending_writes", t.pending_writes},
                     {"corrupt_reads", t.corrupt_reads},
                     {"io_errors", t.io_errors},
                     {"skipped_writes", t.skipped_writes},
                     {"lost_writes", t.lost_writes},
                     {"throttled_writes", t.throttled_writes},
                     {"pinned_chunks", t.pinned_chunks},
                     {"uncommitted_bytes", t.uncommitted_bytes},
                     {"degraded", t.degraded},
                     {"unserved_hits", t.unserved_hits},
                     {"unserved_read_bytes", t.unserved_read_bytes}});
  }
  const auto tier_tokens = [](const kvtier::TierTokens& t) {
    return json{{"hbm", t.hbm}, {"dram", t.dram}, {"nvme", t.nvme}};
  };
  json models = json::array();
  for (const auto& m : s.models) {
    const uint64_t hit = m.hit_tokens.hbm + m.hit_tokens.dram + m.hit_tokens.nvme;
    models.push_back({{"model_id", m.model_id},
                      {"lookup_tokens", m.lookup_tokens},
                      {"hit_tokens", tier_tokens(m.hit_tokens)},
                      {"unserved_hit_tokens", tier_tokens(m.unserved_hit_tokens)},
                      {"token_hit_rate", m.lookup_tokens ? double(hit) / m.lookup_tokens : 0.0}});
  }
  const kvtier::PrefetchOutcomes& p = s.prefetches;
  return {{"tiers", tiers},
          {"models", models},
          {"prefetches", {{"nothing_cached", p.nothing_cached},
                          {"over_budget", p.over_budget},
                          {"used", p.used},
                          {"used_early", p.used_early},
                          {"expired", p.expired},
                          {"session_ended", p.session_ended}}},
          {"lookup_chunks", s.lookup_chunks},
          {"unserved_hit_tokens", s.unserved_hit_tokens},
          {"lookups", s.lookups},
          {"ring_lookups", s.ring_lookups},
          {"ring_calls", s.ring_calls},
          {"lookup_tokens", s.lookup_tokens},
          {"hit_tokens", s.hit_tokens},
          {"token_hit_rate", s.lookup_tokens ? double(s.hit_tokens) / s.lookup_tokens : 0.0},
          {"sessions", s.sessions},
          {"active_leases", s.active_leases},
          {"active_reservations", s.active_reservations},
          {"active_prefetches", s.active_prefetches},
          {"prefetched_chunks", s.prefetched_chunks},
          {"session_limited", s.session_limited},
          {"uptime_s", s.uptime_s}};
}

void PrintStats(const kvtier::DaemonStats& s) {
  std::printf("%-6s %12s %12s %10s %10s %10s %10s %10s %12s %12s\n", "tier", "capacity", "used",
              "cap_chunks", "chunks", "hits", "misses", "evictions", "read", "written");
  for (const auto& t : s.tiers) {
    std::printf("%-6s %12s %12s %10llu %10llu %10llu %10llu %10llu %12s %12s\n", t.name.c_str(),
                kvtier::FormatBytes(t.capacity_bytes).c_str(),
                kvtier::FormatBytes(t.used_bytes).c_str(),
                static_cast<unsigned long long>(t.capacity_chunks),
                static_cast<unsigned long long>(t.chunks),
                static_cast<unsigned long long>(t.hits),
                static_cast<unsigned long long>(t.misses),
                static_cast<unsigned long long>(t.evictions),
                kvtier::FormatBytes(t.read_bytes).c_str(),
                kvtier::FormatBytes(t.write_bytes).c_str());
  }
  std::printf("lookups %llu (%llu over the control ring), lookup tokens %llu, hit tokens %llu "
              "(token hit rate %.4f)\n",
              static_cast<unsigned long long>(s.lookups),
              static_cast<unsigned long long>(s.ring_lookups),
              static_cast<unsigned long long>(s.lookup_tokens),
              static_cast<unsigned long long>(s.hit_tokens),
              s.lookup_tokens ? double(s.hit_tokens) / s.lookup_tokens : 0.0);
  std::printf("sessions %llu, active leases %llu, active reservations %llu, uptime %llu s\n",
              static_cast<unsigned long long>(s.sessions),
              static_cast<unsigned long long>(s.active_leases),
              static_cast<unsigned long long>(s.active_reservations),
              static_cast<unsigned long long>(s.uptime_s));
  std::printf("active prefetches %llu, chunks prefetched from NVMe %llu, calls cut short by "
              "the session limit %llu\n",
              static_cast<unsigned long long>(s.active_prefetches),
              static_cast<unsigned long long>(s.prefetched_chunks),
              static_cast<unsigned long long>(s.session_limited));
  const kvtier::PrefetchOutcomes& p = s.prefetches;
  std::printf("prefetches: used %llu (%llu before their promotion finished), expired %llu, "
              "session ended %llu, nothing cached %llu, over budget %llu\n",
              static_cast<unsigned long long>(p.used + p.used_early),
              static_cast<unsigned long long>(p.used_early),
              static_cast<unsigned long long>(p.expired),
              static_cast<unsigned long long>(p.session_ended),
              static_cast<unsigned long long>(p.nothing_cached),
              static_cast<unsigned long long>(p.over_budget));
  if (s.unserved_hit_tokens > 0) {
    std::printf("hit tokens leased but never answered (client deadline passed): %llu\n",
                static_cast<unsigned long long>(s.unserved_hit_tokens));
  }
  if (s.models.empty()) return;
  std::printf("%-40s %14s %14s %14s %14s %8s\n", "model", "lookup_tokens", "hbm_hits", "dram_hits",
              "nvme_hits", "hit_rate");
  for (const auto& m : s.models) {
    const uint64_t hit = m.hit_tokens.hbm + m.hit_tokens.dram + m.hit_tokens.nvme;
    std::printf("%s %14llu %14llu %14llu %14llu %8.4f\n", Cell(m.model_id, 40).c_str(),
                static_cast<unsigned long long>(m.lookup_tokens),
                static_cast<unsigned long long>(m.hit_tokens.hbm),
                static_cast<unsigned long long>(m.hit_tokens.dram),
                static_cast<unsigned long long>(m.hit_tokens.nvme),
                m.lookup_tokens ? double(hit) / m.lookup_tokens : 0.0);
  }
}

// The scope of `kvtierctl evict`; a usage error names the bad option.
// `tokens_given`: --tokens was on the command line (possibly empty).
kvtier::Result<kvtier::EvictScope> ParseEvictScope(bool all, const std::string& ns_hex,
                                                   bool tokens_given, const std::string& tokens_text,
                                                   const std::string& tokens_file) {
  using kvtier::Status;
  if (all == !ns_hex.empty()) return Status::InvalidArgument("give exactly one of --all and --namespace");
  if (all && (tokens_given || !tokens_file.empty())) {
    return Status::InvalidArgument("--tokens and --tokens-file go with --namespace, not --all");
  }
  if (all) return kvtier::EvictScope::All();
  auto id = kvtier::ChunkKey::FromHex(ns_hex);
  if (!id) {
    return Status::InvalidArgument("--namespace '" + ns_hex +
                                   "' is not a namespace id (32 hex digits, as "
                                   "`kvtierctl namespaces` prints)");
  }
  // --tokens: comma-separated int32 ids, each in full (CLI11's own list took
  // "" and "1,,2" for ids it made up).
  std::vector<int32_t> tokens;
  if (tokens_given && !tokens_text.empty()) {
    size_t at = 0;
    for (size_t i = 0;; ++i) {
      const size_t comma = std::min(tokens_text.find(',', at), tokens_text.size());
      const std::string_view item(tokens_text.data() + at, comma - at);
      int32_t id = 0;
      const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), id);
      if (item.empty() || ec != std::errc() || end != item.data() + item.size()) {
        return Status::InvalidArgument("--tokens: item " + std::to_string(i) + " ('" +
                                       std::string(item) + "') is not an int32 token id");
      }
      tokens.push_back(id);
      if (comma == tokens_text.size()) break;
      at = comma + 1;
    }
  }
  if (!tokens_file.empty()) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(tokens_file, ec)) {
      return Status::InvalidArgument("--tokens-file " + tokens_file + ": not a readable file");
    }
    std::ifstream in(tokens_file);
    json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (!j.is_array()) {
      return Status::InvalidArgument("--tokens-file " + tokens_file +
                                     " is not a JSON array of int32 token ids");
    }
    tokens.clear();
    for (size_t i = 0; i < j.size(); ++i) {
      const json& v = j[i];
      if (!v.is_number_integer() || v.get<int64_t>() < INT32_MIN || v.get<int64_t>() > INT32_MAX ||
          (v.is_number_unsigned() && v.get<uint64_t>() > INT32_MAX)) {
        return Status::InvalidArgument("--tokens-file " + tokens_file + ": element " +
                                       std::to_string(i) + " (" + v.dump() +
                                       ") is not an int32 token id");
      }
      tokens.push_back(v.get<int32_t>());
    }
    tokens_given = true;
  }
  if (!tokens_given) return kvtier::EvictScope::Namespace(*id);
  if (tokens.empty()) {
    return Status::InvalidArgument("the token list is empty: give at least one chunk of ids, or "
                                   "no --tokens to evict the whole namespace");
  }
  return kvtier::EvictScope::Prefix(*id, std::move(tokens));
}

}  // namespace

int main(int argc, char** argv) {
  kvtier::LogToStderr("kvtierctl");  // results go to stdout; logs, the SDK's too, to stderr
  std::string socket_path = kvtier::DefaultSocketPath();
  bool as_json = false;
  int timeout_ms = 2000;  // evict: 30000 unless given (an eviction of millions of chunks takes seconds)
  CLI::App app{"kvtierctl: admin CLI of kvtierd", "kvtierctl"};
  app.add_option("--socket", socket_path, "kvtierd socket")->capture_default_str();
  app.add_flag("--json", as_json, "print JSON instead of a table");
  auto* timeout_opt = app.add_option("--timeout-ms", timeout_ms,
                                     "deadline of the RPC (default 2000; 30000 for evict)")
                          ->check(CLI::Range(1, 600000));
  app.require_subcommand(1);
  // Subcommands made after this pass the options they do not know (--socket,
  // --json, --timeout-ms) to the app: they may come before or after one.
  app.fallthrough();
  auto* stats = app.add_subcommand("stats", "tier capacities, hits, evictions, bytes moved");
  auto* health = app.add_subcommand("health", "exit 0 when the daemon is serving");
  auto* namespaces = app.add_subcommand("namespaces", "namespaces the daemon holds");
  auto* evict = app.add_subcommand(
      "evict", "drop cached chunks from every tier now (chunks under lease are kept and counted)");
  bool evict_all = false;
  std::string evict_ns, tokens_file;
  std::string evict_tokens;
  evict->add_flag("--all", evict_all, "every chunk of every namespace");
  evict->add_option("--namespace", evict_ns, "every chunk of this namespace (its id)");
  auto* tokens_opt = evict->add_option("--tokens", evict_tokens,
                                       "with --namespace: evict the prompts beginning with these "
                                       "token ids (comma-separated)");
  evict->add_option("--tokens-file", tokens_file, "the same, as a JSON array in a file")
      ->excludes(tokens_opt);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (kvtier::tools::ReportUnplacedWord(app, "kvtierctl")) return 2;
    return app.exit(e) == 0 ? 0 : 2;  // --help exits 0; usage errors exit 2
  }

  kvtier::EvictScope evict_scope;
  if (evict->parsed()) {
    if (timeout_opt->count() == 0) timeout_ms = 30000;
    auto scope = ParseEvictScope(evict_all, evict_ns, tokens_opt->count() > 0, evict_tokens,
                                 tokens_file);
    if (!scope.ok()) {
      std::fprintf(stderr, "kvtierctl evict: %s\n", scope.status().message().c_str());
      return 2;
    }
    evict_scope = std::move(*scope);
  }

  // A daemon that cannot be reached or refuses the call: exit 1 (JSON under --json).
  auto fail = [&](const kvtier::Status& st) {
    if (as_json) {
      std::printf("%s\n", json{{"serving", false}, {"error", st.message()}}.dump(2).c_str());
    } else {
      std::fprintf(stderr, "kvtierctl: kvtierd at %s: %s\n", socket_path.c_str(),
                   st.message().c_str());
    }
    return 1;
  };
  auto admin_or = kvtier::AdminClient::Connect(socket_path, std::chrono::milliseconds(timeout_ms));
  if (!admin_or.ok()) return fail(admin_or.status());  // a path that is no socket, say
  auto& admin = *admin_or;

  if (stats->parsed()) {
    auto s = admin->Stats();
    if (!s.ok()) return fail(s.status());
    if (as_json) {
      std::printf("%s\n", StatsJson(*s).dump(2).c_str());
    } else {
      PrintStats(*s);
    }
  } else if (health->parsed()) {
    auto h = admin->Health();
    if (!h.ok()) return fail(h.status());
    if (as_json) {
      std::printf("%s\n", json{{"serving", h->serving},
                               {"version", h->version},
                               {"pid", h->pid},
                               {"epoch", h->epoch},
                               {"degraded_tiers", h->degraded_tiers}}
                              .dump(2)
                              .c_str());
    } else {
      std::string degraded;
      for (const auto& t : h->degraded_tiers) degraded += (degraded.empty() ? "" : ", ") + t;
      std::printf("%s%s (kvtierd %s, pid %u, epoch %016llx)\n",
                  h->serving ? "serving" : "not serving",
                  degraded.empty() ? "" : (", degraded: " + degraded).c_str(), h->version.c_str(),
                  h->pid, static_cast<unsigned long long>(h->epoch));
    }
    return h->serving ? 0 : 1;
  } else if (evict->parsed()) {
    auto tiers = admin->Evict(evict_scope);
    if (!tiers.ok() && tiers.status().code() == kvtier::StatusCode::kDeadlineExceeded) {
      // kvtierd goes on with an eviction whose caller stopped waiting.
      return fail(kvtier::Status(kvtier::StatusCode::kDeadlineExceeded,
                                 tiers.status().message() +
                                     "; kvtierd may still finish the eviction (its log says "
                                     "what it removed): give a longer --timeout-ms to wait for it"));
    }
    if (!tiers.ok()) return fail(tiers.status());
    if (as_json) {
      json arr = json::array();
      for (const auto& t : *tiers) arr.push_back({{"tier", t.tier}, {"removed", t.removed}, {"kept", t.kept}});
      std::printf("%s\n", json{{"tiers", arr}}.dump(2).c_str());
    } else {
      std::printf("%-6s %10s %10s\n", "tier", "removed", "kept");
      uint64_t kept = 0;
      for (const auto& t : *tiers) {
        std::printf("%-6s %10llu %10llu\n", t.tier.c_str(), static_cast<unsigned long long>(t.removed),
                    static_cast<unsigned long long>(t.kept));
        kept += t.kept;
      }
      uint64_t removed = 0;
      for (const auto& t : *tiers) removed += t.removed;
      if (removed == 0 && kept == 0) {
        std::printf(evict_all ? "nothing matched: no chunk is cached\n"
                              : "nothing matched: no chunk of that scope is cached (check the "
                                "namespace id with `kvtierctl namespaces`)\n");
      }
      if (kept > 0) {
        std::printf("%llu chunks were kept: a lease, a read or a copy holds them (or a chunk after "
                    "them); run evict again once they are released\n",
                    static_cast<unsigned long long>(kept));
      }
    }
  } else if (namespaces->parsed()) {
    auto list = admin->Namespaces();
    if (!list.ok()) return fail(list.status());
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
        std::printf("%-32s %s %s %-4s %-8s %-4s %6u %6u %6u %6u %2u/%-2u %10llu %10s\n",
                    n.id.ToHex().c_str(), Cell(s.model_id, 28).c_str(),
                    Cell(s.lora_id.empty() ? "-" : s.lora_id, 16).c_str(),
                    s.cache_salt.empty() ? "-" : "set", s.kv_dtype.c_str(), s.layout.c_str(),
                    s.num_layers, s.num_kv_heads, s.layout == "mla" ? s.latent_dim : s.head_dim,
                    s.chunk_tokens, s.tp_rank, s.tp_size, static_cast<unsigned long long>(n.chunks),
                    kvtier::FormatBytes(n.slot_bytes).c_str());
      }
    }
  }
  return 0;
}
