// kvtierctl's shared argument parsing (evict and ls take the same scope words).
#include <charconv>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "ctl.h"

namespace kvtier::ctl {

using nlohmann::json;

int Fail(const std::string& socket_path, bool as_json, const Status& st) {
  if (as_json) {
    std::printf("%s\n", json{{"serving", false}, {"error", st.message()}}.dump(2).c_str());
  } else {
    std::fprintf(stderr, "kvtierctl: kvtierd at %s: %s\n", socket_path.c_str(),
                 st.message().c_str());
  }
  return 1;
}

void AddScopeOptions(CLI::App* sub, ScopeArgs* args, const std::string& ns_help,
                     const std::string& tokens_help) {
  sub->add_option("--namespace", args->ns_hex, ns_help);
  args->tokens_opt = sub->add_option("--tokens", args->tokens_text, tokens_help);
  sub->add_option("--tokens-file", args->tokens_file, "the same, as a JSON array in a file")
      ->excludes(args->tokens_opt);
}

Result<NamespaceId> ParseNamespaceArg(const std::string& ns_hex) {
  auto id = ChunkKey::FromHex(ns_hex);
  if (!id) {
    return Status::InvalidArgument("--namespace '" + ns_hex +
                                   "' is not a namespace id (32 hex digits, as "
                                   "`kvtierctl namespaces` prints)");
  }
  return *id;
}

Result<std::optional<std::vector<int32_t>>> ParseTokenArgs(bool tokens_given,
                                                           const std::string& tokens_text,
                                                           const std::string& tokens_file) {
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
  if (!tokens_given) return std::optional<std::vector<int32_t>>();
  if (tokens.empty()) {
    return Status::InvalidArgument(
        "the token list is empty: give at least one chunk of ids, or "
        "no --tokens for the whole namespace");
  }
  return std::optional<std::vector<int32_t>>(std::move(tokens));
}

}  // namespace kvtier::ctl
