// A usage error that names the word CLI11 could not place: a tool with
// subcommands otherwise says only "A subcommand is required" for a mistyped one.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

namespace kvtier::tools {

// After `app.parse` threw: when no subcommand was given and a word was left
// over, prints "<tool>: 'word' is not a command (a, b, ...)" (or "is not an
// option" for one starting with '-') to stderr and returns true.
inline bool ReportUnplacedWord(const CLI::App& app, const char* tool) {
  if (!app.get_subcommands().empty() || app.remaining().empty()) return false;
  const std::string word = app.remaining().front();
  std::string commands;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    commands += (commands.empty() ? "" : ", ") + sub->get_name();
  }
  std::fprintf(stderr, "%s: '%s' is not %s (commands: %s); run with --help for more information\n",
               tool, word.c_str(), word.starts_with("-") ? "an option" : "a command",
               commands.c_str());
  return true;
}

// For an unsigned option (a count, a sequence number): refuses a negative
// value (an unsigned type would take "-5" as 2^64 - 5) with "-5 is negative",
// where CLI::NonNegativeNumber prints the range 0 to DBL_MAX in full, and a
// word ("abc is not a whole number", where CLI::Range says "not in range").
inline const CLI::Validator kCount(
    [](std::string& value) -> std::string {
      if (value.starts_with("-")) return value + " is negative: give a whole number";
      if (value.empty() || value.find_first_not_of("0123456789") != std::string::npos) {
        return "'" + value + "' is not a whole number";
      }
      return "";
    },
    "COUNT");

}  // namespace kvtier::tools
