// kvtierctl's commands, one file each beside main.cc (which parses the command
// line and connects). Each Run* prints its result (a table, or JSON with
// `as_json`) and returns the exit code: 0 done, 1 the daemon refused or could
// not be reached (its message on stderr, or JSON on stdout with --json).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "kvtier/admin_client.h"
#include "kvtier/status.h"

namespace kvtier::ctl {

// Prints a daemon error (exit 1): JSON {"serving": false, "error": ...} on
// stdout under --json, else a line naming the socket on stderr.
int Fail(const std::string& socket_path, bool as_json, const Status& st);

// --tokens (comma-separated int32 ids, each in full) or --tokens-file (a JSON
// array of int32). nullopt when neither was given. Errors: INVALID_ARGUMENT
// naming the option (an empty list too).
Result<std::optional<std::vector<int32_t>>> ParseTokenArgs(bool tokens_given,
                                                           const std::string& tokens_text,
                                                           const std::string& tokens_file);
// The scope words evict and ls share: --namespace ID, and --tokens or
// --tokens-file (exclusive) for a prompt prefix of it.
struct ScopeArgs {
  std::string ns_hex, tokens_text, tokens_file;
  CLI::Option* tokens_opt = nullptr;  // --tokens: given at all (possibly empty)
  bool tokens_given() const { return tokens_opt->count() > 0; }
};
// Adds them to `sub`; `ns_help` and `tokens_help` say what they select there.
void AddScopeOptions(CLI::App* sub, ScopeArgs* args, const std::string& ns_help,
                     const std::string& tokens_help);

// --namespace ID. Errors: INVALID_ARGUMENT naming it.
Result<NamespaceId> ParseNamespaceArg(const std::string& ns_hex);

// stats.cc
nlohmann::json StatsJson(const DaemonStats& s);
void PrintStats(const DaemonStats& s);
// stats --watch: `count` blocks (0: until interrupted), one per `interval_s`.
int RunWatch(AdminClient& admin, const std::string& socket_path, bool as_json, double interval_s,
             uint64_t count);
// flush: polls Stats until the nvme tier's pending_writes is 0, at most `timeout_s`.
int RunFlush(AdminClient& admin, const std::string& socket_path, bool as_json, double timeout_s);

// evict.cc: health (exit 1 when not serving) and evict.
int RunHealth(AdminClient& admin, const std::string& socket_path, bool as_json);
int RunEvict(AdminClient& admin, const std::string& socket_path, bool as_json,
             const EvictScope& scope);

// ls.cc
int RunNamespaces(AdminClient& admin, const std::string& socket_path, bool as_json);
int RunLs(AdminClient& admin, const std::string& socket_path, bool as_json, const NamespaceId& ns,
          const std::vector<int32_t>& tokens, uint32_t limit);
int RunConfig(AdminClient& admin, const std::string& socket_path, bool as_json);

// events.cc: prints kvtierd's KV events live, one line each (JSON lines with
// `as_json`), and each gap in their sequence numbers (refilled from the
// replay socket when it can be). Without `address`, asks `admin` for the
// daemon's events_address and events_replay_address.
struct EventsArgs {
  std::string address, replay_address;  // "" : the daemon's
  uint64_t count = 0;                   // stop after N events; 0: until interrupted
  std::optional<uint64_t> from;         // first replay the buffered batches from this sequence
};
int RunEvents(AdminClient* admin, const std::string& socket_path, bool as_json, EventsArgs args);

// completion.cc: a completion script for `shell` ("bash" or "zsh") made from
// `app`'s subcommands and options (so that it follows the CLI).
std::string CompletionScript(const CLI::App& app, const std::string& shell);

}  // namespace kvtier::ctl
