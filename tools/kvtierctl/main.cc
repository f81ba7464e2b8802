// kvtierctl: the admin CLI of kvtierd.
//   kvtierctl [--socket PATH] [--json] [--timeout-ms MS] COMMAND
//     stats [--watch [SECONDS] [--count N]] | health | namespaces | config
//     ls [--namespace ID [--tokens 1,2,3 | --tokens-file F.json] [--limit N]]
//     evict (--all | --namespace ID [--tokens 1,2,3 | --tokens-file F.json])
//     flush [--timeout SECONDS] | completion bash|zsh
//     events [--address A] [--replay-address R] [--from SEQ] [--count N]
// Human tables by default, --json for scripts. Exit codes: 0 OK (health:
// serving), 1 daemon unreachable, refusing or not serving (flush: not drained),
// 2 usage error. The commands live beside this file (ctl.h).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "ctl.h"
#include "kvtier/admin_client.h"
#include "kvtier/logging.h"
#include "kvtier/socket_path.h"
#include "kvtier/tools/cli_words.h"

namespace {

using nlohmann::json;
namespace ctl = kvtier::ctl;

// The scope of `kvtierctl evict`; a usage error names the bad option.
kvtier::Result<kvtier::EvictScope> ParseEvictScope(bool all, const ctl::ScopeArgs& a) {
  using kvtier::Status;
  if (all == !a.ns_hex.empty()) {
    return Status::InvalidArgument("give exactly one of --all and --namespace");
  }
  if (all && (a.tokens_given() || !a.tokens_file.empty())) {
    return Status::InvalidArgument("--tokens and --tokens-file go with --namespace, not --all");
  }
  if (all) return kvtier::EvictScope::All();
  auto id = ctl::ParseNamespaceArg(a.ns_hex);
  if (!id.ok()) return id.status();
  auto tokens = ctl::ParseTokenArgs(a.tokens_given(), a.tokens_text, a.tokens_file);
  if (!tokens.ok()) return tokens.status();
  if (!*tokens) return kvtier::EvictScope::Namespace(*id);
  return kvtier::EvictScope::Prefix(*id, std::move(**tokens));
}

// A number of seconds > 0 given as text (--watch, --timeout); nullopt when it is not one.
std::optional<double> Seconds(const std::string& text) {
  try {
    size_t used = 0;
    const double s = std::stod(text, &used);
    if (used == text.size() && s > 0 && s <= 86400) return s;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  kvtier::LogToStderr("kvtierctl");  // results go to stdout; logs, the SDK's too, to stderr
  std::string socket_path = kvtier::DefaultSocketPath();
  bool as_json = false;
  int timeout_ms =
      2000;  // evict: 30000 unless given (an eviction of millions of chunks takes seconds)
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
  std::string watch_text;
  uint64_t watch_count = 0;
  auto* watch_opt = stats
                        ->add_option("--watch", watch_text,
                                     "print rates between samples every SECONDS (default 1) "
                                     "until interrupted")
                        ->expected(0, 1);
  auto* count_opt = stats->add_option("--count", watch_count, "with --watch: stop after N samples")
                        ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 40));
  auto* ls = app.add_subcommand(
      "ls",
      "namespaces, or with --namespace the chunks of one (key, tiers, bytes, age, hits, pinned)");
  ctl::ScopeArgs ls_scope;
  uint32_t ls_limit = 1000;
  ctl::AddScopeOptions(ls, &ls_scope, "list the chunks of this namespace (its id)",
                       "with --namespace: only the chunks of the prompt beginning with these "
                       "token ids (comma-separated)");
  auto* limit_opt = ls->add_option("--limit", ls_limit, "list at most N chunks (1..100000)")
                        ->capture_default_str()
                        ->check(CLI::Range(1, 100000));
  auto* flush = app.add_subcommand("flush", "wait until the NVMe tier's pending writes drain");
  std::string flush_timeout = "60";
  flush->add_option("--timeout", flush_timeout, "give up after SECONDS")->capture_default_str();
  auto* config = app.add_subcommand("config", "the daemon's effective configuration");
  auto* completion = app.add_subcommand("completion", "print a shell completion script");
  std::string shell;
  completion->add_option("shell", shell, "bash or zsh")
      ->required()
      ->check(CLI::IsMember({"bash", "zsh"}));
  auto* evict = app.add_subcommand(
      "evict", "drop cached chunks from every tier now (chunks under lease are kept and counted)");
  bool evict_all = false;
  ctl::ScopeArgs evict_scope_args;
  evict->add_flag("--all", evict_all, "every chunk of every namespace");
  ctl::AddScopeOptions(evict, &evict_scope_args, "every chunk of this namespace (its id)",
                       "with --namespace: evict the prompts beginning with these token ids "
                       "(comma-separated)");
  auto* events = app.add_subcommand(
      "events", "print kvtierd's KV events live (vLLM's schema), one line each, and gaps");
  ctl::EventsArgs events_args;
  uint64_t events_from = 0;
  auto* address_opt =
      events->add_option("--address", events_args.address,
                         "the events endpoint (default: the daemon's events_address)");
  auto* replay_opt =
      events->add_option("--replay-address", events_args.replay_address,
                         "the replay endpoint (default: the daemon's events_replay_address)");
  // kCount first: CLI11's Range alone calls "abc" out of range.
  auto* from_opt = events
                       ->add_option("--from", events_from,
                                    "first print the buffered batches from this sequence number")
                       ->check(kvtier::tools::kCount);
  events->add_option("--count", events_args.count, "stop after N events")
      ->check(kvtier::tools::kCount)
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 40));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (kvtier::tools::ReportUnplacedWord(app, "kvtierctl")) return 2;
    return app.exit(e) == 0 ? 0 : 2;  // --help exits 0; usage errors exit 2
  }

  if (completion->parsed()) {
    std::printf("%s", ctl::CompletionScript(app, shell).c_str());
    return 0;
  }
  auto usage = [](const char* cmd, const std::string& message) {
    std::fprintf(stderr, "kvtierctl %s: %s\n", cmd, message.c_str());
    return 2;
  };
  kvtier::EvictScope evict_scope;
  if (evict->parsed()) {
    if (timeout_opt->count() == 0) timeout_ms = 30000;
    auto scope = ParseEvictScope(evict_all, evict_scope_args);
    if (!scope.ok()) return usage("evict", scope.status().message());
    evict_scope = std::move(*scope);
  }
  double watch_s = 0;
  if (stats->parsed() && watch_opt->count() > 0) {
    auto s = Seconds(watch_text.empty() ? "1" : watch_text);
    if (!s) return usage("stats", "--watch '" + watch_text + "' is not a number of seconds > 0");
    watch_s = *s;
  } else if (stats->parsed() && count_opt->count() > 0) {
    return usage("stats", "--count goes with --watch");
  }
  double flush_s = 0;
  if (flush->parsed()) {
    auto s = Seconds(flush_timeout);
    if (!s)
      return usage("flush", "--timeout '" + flush_timeout + "' is not a number of seconds > 0");
    flush_s = *s;
  }
  kvtier::NamespaceId ls_id;
  std::vector<int32_t> ls_prefix;
  if (ls->parsed() && ls_scope.ns_hex.empty()) {
    if (ls_scope.tokens_given() || !ls_scope.tokens_file.empty() || limit_opt->count() > 0) {
      return usage("ls", "--tokens, --tokens-file and --limit go with --namespace");
    }
  } else if (ls->parsed()) {
    auto id = ctl::ParseNamespaceArg(ls_scope.ns_hex);
    if (!id.ok()) return usage("ls", id.status().message());
    ls_id = *id;
    auto tokens =
        ctl::ParseTokenArgs(ls_scope.tokens_given(), ls_scope.tokens_text, ls_scope.tokens_file);
    if (!tokens.ok()) return usage("ls", tokens.status().message());
    if (*tokens) ls_prefix = std::move(**tokens);
  }

  if (events->parsed()) {
    for (const CLI::Option* o : {address_opt, replay_opt}) {
      if (o->count() > 0 && o->as<std::string>().empty()) {
        return usage("events", o->get_name() +
                                   " is empty: give an endpoint, or leave it out "
                                   "for the daemon's");
      }
    }
  }
  if (from_opt->count() > 0) events_args.from = events_from;
  auto fail = [&](const kvtier::Status& st) { return ctl::Fail(socket_path, as_json, st); };
  if (events->parsed() && !events_args.address.empty()) {  // needs no daemon
    return ctl::RunEvents(nullptr, socket_path, as_json, events_args);
  }
  auto admin_or = kvtier::AdminClient::Connect(socket_path, std::chrono::milliseconds(timeout_ms));
  if (!admin_or.ok()) return fail(admin_or.status());  // a path that is no socket, say
  auto& admin = *admin_or;

  if (stats->parsed() && watch_s > 0) {
    return ctl::RunWatch(*admin, socket_path, as_json, watch_s, watch_count);
  } else if (stats->parsed()) {
    auto s = admin->Stats();
    if (!s.ok()) return fail(s.status());
    if (as_json) {
      std::printf("%s\n", ctl::StatsJson(*s).dump(2).c_str());
    } else {
      ctl::PrintStats(*s);
    }
  } else if (health->parsed()) {
    return ctl::RunHealth(*admin, socket_path, as_json);
  } else if (evict->parsed()) {
    return ctl::RunEvict(*admin, socket_path, as_json, evict_scope);
  } else if (namespaces->parsed() || (ls->parsed() && ls_scope.ns_hex.empty())) {
    return ctl::RunNamespaces(*admin, socket_path, as_json);
  } else if (ls->parsed()) {
    return ctl::RunLs(*admin, socket_path, as_json, ls_id, ls_prefix, ls_limit);
  } else if (flush->parsed()) {
    return ctl::RunFlush(*admin, socket_path, as_json, flush_s);
  } else if (config->parsed()) {
    return ctl::RunConfig(*admin, socket_path, as_json);
  } else if (events->parsed()) {
    return ctl::RunEvents(admin.get(), socket_path, as_json, events_args);
  }
  return 0;
}
