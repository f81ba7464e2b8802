// kvtierctl completion bash|zsh: completion scripts generated from the CLI11
// app's own subcommands and options, so that they cannot drift from the CLI.
#include <algorithm>
#include <string>
#include <vector>

#include "ctl.h"

namespace kvtier::ctl {
namespace {

struct Opt {
  std::string name;  // --long
  std::string help;
  bool takes_value = false;
  bool optional_value = false;  // --watch [SECONDS]
  bool is_file = false;         // completes file names
};
struct Cmd {
  std::string name, help;
  std::vector<Opt> opts;
  std::vector<std::string> words;  // values of its positional argument, if any
};

// `app`'s options with a long name, less those in `skip` (the global ones a
// subcommand repeats, such as --help).
std::vector<Opt> Options(const CLI::App& app, const std::vector<Opt>& skip = {}) {
  std::vector<Opt> out;
  for (const CLI::Option* o : app.get_options()) {
    if (o->get_lnames().empty()) continue;  // a positional
    const std::string name = "--" + o->get_lnames().front();
    if (std::any_of(skip.begin(), skip.end(), [&](const Opt& g) { return g.name == name; })) {
      continue;
    }
    const bool value = o->get_expected_max() > 0;
    out.push_back({name, o->get_description(), value, value && o->get_expected_min() == 0,
                   value && (name == "--socket" || name.ends_with("-file"))});
  }
  return out;
}

// Text safe inside a zsh '...' spec: no quotes, brackets or colons.
std::string ZshText(std::string s) {
  for (char& c : s) {
    if (c == '\'' || c == '[' || c == ']' || c == ':' || c == '\\' || c == '`') c = ' ';
  }
  return s;
}

std::string Join(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& s : v) out += (out.empty() ? "" : " ") + s;
  return out;
}

std::string Bash(const std::vector<Opt>& global, const std::vector<Cmd>& cmds) {
  std::vector<std::string> names, global_names, file_opts;
  for (const Cmd& c : cmds) names.push_back(c.name);
  for (const Opt& o : global) global_names.push_back(o.name);
  std::string s =
      "# bash completion for kvtierctl: source <(kvtierctl completion bash)\n"
      "_kvtierctl() {\n"
      "  local cur=\"${COMP_WORDS[COMP_CWORD]}\" prev=\"\" cmd=\"\" i\n"
      "  ((COMP_CWORD > 0)) && prev=\"${COMP_WORDS[COMP_CWORD-1]}\"\n"
      "  local commands=\"" +
      Join(names) +
      "\"\n"
      "  for ((i = 1; i < COMP_CWORD; i++)); do\n"
      "    case \" $commands \" in *\" ${COMP_WORDS[i]} \"*) cmd=\"${COMP_WORDS[i]}\"; break;; "
      "esac\n"
      "  done\n"
      "  case \"$prev\" in\n";
  for (const Opt& o : global) {
    if (o.is_file) file_opts.push_back(o.name);
  }
  for (const Cmd& c : cmds) {
    for (const Opt& o : c.opts) {
      if (o.is_file && std::find(file_opts.begin(), file_opts.end(), o.name) == file_opts.end()) {
        file_opts.push_back(o.name);
      }
    }
  }
  std::string files;
  for (const std::string& f : file_opts) files += (files.empty() ? "" : "|") + f;
  if (!files.empty()) {
    s += "    " + files + ") COMPREPLY=($(compgen -f -- \"$cur\")); return 0;;\n";
  }
  s += "  esac\n"
       "  local words=\"" +
       Join(global_names) +
       "\"\n"
       "  case \"$cmd\" in\n"
       "    \"\") words=\"$commands $words\";;\n";
  for (const Cmd& c : cmds) {
    std::vector<std::string> w = c.words;
    for (const Opt& o : c.opts) w.push_back(o.name);
    s += "    " + c.name + ") words=\"$words " + Join(w) + "\";;\n";
  }
  s += "  esac\n"
       "  COMPREPLY=($(compgen -W \"$words\" -- \"$cur\"))\n"
       "}\n"
       "complete -F _kvtierctl kvtierctl\n";
  return s;
}

std::string ZshSpec(const Opt& o) {
  std::string spec = "'" + o.name + "[" + ZshText(o.help) + "]";
  if (o.takes_value) {
    spec += std::string(o.optional_value ? "::" : ":") + o.name.substr(2) + ":" +
            (o.is_file ? "_files" : "");
  }
  return spec + "'";
}

std::string Zsh(const std::vector<Opt>& global, const std::vector<Cmd>& cmds) {
  std::string s =
      "#compdef kvtierctl\n"
      "# zsh completion for kvtierctl: source <(kvtierctl completion zsh), or save as _kvtierctl\n"
      "# in a directory of $fpath\n"
      "_kvtierctl() {\n"
      "  local curcontext=\"$curcontext\" state line\n"
      "  local -a commands\n"
      "  commands=(\n";
  for (const Cmd& c : cmds) s += "    '" + c.name + ":" + ZshText(c.help) + "'\n";
  s += "  )\n"
       "  _arguments -C \\\n";
  for (const Opt& o : global) s += "    " + ZshSpec(o) + " \\\n";
  s += "    '1: :->command' \\\n"
       "    '*:: :->args'\n"
       "  case $state in\n"
       "    command) _describe -t commands 'kvtierctl command' commands ;;\n"
       "    args)\n"
       "      case $words[1] in\n";
  for (const Cmd& c : cmds) {
    s += "        " + c.name + ") _arguments";
    for (const Opt& o : global) s += " " + ZshSpec(o);
    for (const Opt& o : c.opts) s += " " + ZshSpec(o);
    if (!c.words.empty()) s += " '1:" + c.name + ":(" + Join(c.words) + ")'";
    s += " ;;\n";
  }
  s += "      esac ;;\n"
       "  esac\n"
       "}\n"
       "if [[ \"${funcstack[1]}\" == _kvtierctl ]]; then _kvtierctl \"$@\"; else compdef "
       "_kvtierctl kvtierctl; fi\n";
  return s;
}

}  // namespace

std::string CompletionScript(const CLI::App& app, const std::string& shell) {
  const std::vector<Opt> global = Options(app);
  std::vector<Cmd> cmds;
  for (const CLI::App* sub : app.get_subcommands({})) {
    Cmd c{sub->get_name(), sub->get_description(), Options(*sub, global), {}};
    if (c.name == "completion") c.words = {"bash", "zsh"};
    cmds.push_back(std::move(c));
  }
  return shell == "zsh" ? Zsh(global, cmds) : Bash(global, cmds);
}

}  // namespace kvtier::ctl
