// kvtier-replay: drives kvtierd with a real trace through the client SDK, with
// real bytes, and reports token hit rate, bytes moved, latencies and verify
// errors. Closed loop by default: one request at a time, in trace order
// (replay.h); --rate replays at the trace's own arrival times on N clients
// (rate.h); --sweep starts a fresh kvtierd a capacity point and writes a CSV
// and a plot with the offline LRU and Belady references (sweep.h).
//
// Per request: with --prefetch, Prefetch when the request arrives, then wait
// --schedule-delay-ms (the time it spends queued in an engine) before its Load;
// Load (Lookup with lease + copy of the hit chunks + release),
// verify every loaded byte against the deterministic payload of its chunk key,
// then Store the missing full chunks (payload written straight into the arena).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "kvtier/admin_client.h"
#include "kvtier/logging.h"
#include "kvtier/socket_path.h"
#include "kvtier/tools/cli_words.h"
#include "kvtier/tools/trace.h"
#include "nodes.h"
#include "rate.h"
#include "replay.h"
#include "summary.h"
#include "sweep.h"

namespace {

namespace fs = std::filesystem;
using kvtier::replay::Progress;
using kvtier::replay::ReplayOptions;
using kvtier::replay::Totals;

// 0 when `path` can be written (checked before a long run), else 2 (printed).
int CheckWritable(const std::string& flag, const std::string& path) {
  const fs::path dir = fs::path(path).parent_path();
  const std::string d = dir.empty() ? "." : dir.string();
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    std::fprintf(stderr, "kvtier-replay: %s %s is a folder; give a file path\n", flag.c_str(),
                 path.c_str());
    return 2;
  }
  if (access(d.c_str(), W_OK) != 0) {
    std::fprintf(stderr, "kvtier-replay: %s %s: cannot write into %s: %s\n", flag.c_str(),
                 path.c_str(), d.c_str(), std::strerror(errno));
    return 2;
  }
  return 0;
}

// NVMe bytes (read, written) from the daemon's counters: nullopt when Stats fails.
// kvtierd beside this executable.
std::string DefaultKvtierd() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? "kvtierd" : (self.parent_path() / "kvtierd").string();
}

}  // namespace

int main(int argc, char** argv) {
  kvtier::LogToStderr("kvtier-replay");  // results go to stdout; logs, the SDK's too, to stderr
  ReplayOptions ro;
  std::string trace_path, json_path, sweep_text, csv_path, png_path;
  std::string kvtierd_path = DefaultKvtierd(), plot_script = KVTIER_PLOT_SWEEP_SCRIPT, nvme_dir;
  uint64_t limit = 0, generate = 0;
  int64_t deadline_ms = 100;
  bool quiet = false, progress_flag = false, at_rate = false, no_plot = false;
  kvtier::replay::RateOptions rate;
  std::string nodes_text;
  kvtier::replay::NodesOptions nodes;
  CLI::App app{"kvtier-replay: replay a Mooncake-format trace through kvtierd with real bytes",
               "kvtier-replay"};
  auto* socket_opt =
      app.add_option("--socket", ro.socket_path, "kvtierd socket (default: the daemon's default)");
  auto* trace_opt =
      app.add_option("--trace", trace_path, "Mooncake JSONL trace")->check(CLI::ExistingFile);
  auto* generate_opt =
      app.add_option("--generate", generate,
                     "instead of --trace: N requests (1 to 1,000,000) of the built-in multi-turn "
                     "generator")
          ->check(kvtier::tools::kCount)
          ->check(CLI::Range(uint64_t{1}, uint64_t{1'000'000}))  // all are generated up front
          ->excludes(trace_opt);
  app.add_option("--model", ro.model, "tiny | qwen2.5-0.5b | llama3-8b")->capture_default_str();
  app.add_option("--chunk-tokens", ro.chunk_tokens, "tokens per chunk")->capture_default_str();
  app.add_option("--limit", limit, "with --trace: replay the first N requests (0 = all)")
      ->check(kvtier::tools::kCount)
      ->excludes(generate_opt);  // --generate N already says how many
  auto* json_opt = app.add_option(
      "--json", json_path,
      "write the summary as JSON here ('-': JSON alone on stdout, the table on stderr)");
  app.add_option("--deadline-ms", deadline_ms, "client deadline per RPC")
      ->check(CLI::Range(int64_t{1}, int64_t{600000}))
      ->capture_default_str();
  app.add_option("--prefetch", ro.prefetch,
                 "prefetch on arrival with this policy: off, best_effort, wait_complete, timeout")
      ->check(CLI::IsMember({"off", "best_effort", "wait_complete", "timeout"}))
      ->capture_default_str();
  app.add_option("--schedule-delay-ms", ro.schedule_delay_ms,
                 "time from a request's arrival (and prefetch) to its load")
      ->check(CLI::Range(int64_t{0}, int64_t{60000}))
      ->capture_default_str();
  auto* quiet_opt = app.add_flag("--quiet", quiet, "no progress line");
  app.add_flag("--progress", progress_flag,
               "a progress line with ETA on stderr even when it is not a terminal")
      ->excludes(quiet_opt);
  auto* rate_opt = app.add_flag("--rate", at_rate,
                                "open loop: start each request at its trace time, on --clients "
                                "concurrent clients");
  app.add_option("--clients", rate.clients, "with --rate: concurrent clients (1 to 256)")
      ->check(CLI::Range(1u, 256u))
      ->needs(rate_opt)
      ->capture_default_str();
  app.add_option("--speedup", rate.speedup, "with --rate: run the trace's clock this much faster")
      ->check(CLI::Range(1e-3, 1e9))
      ->needs(rate_opt)
      ->capture_default_str();
  auto* nodes_opt =
      app.add_option("--nodes", nodes_text,
                     "sock1,sock2,...: replay across these kvtierd (nodes sharing a remote tier), "
                     "each request to one node by --route")
          ->excludes(socket_opt)
          ->excludes(rate_opt);
  app.add_option("--route", nodes.route,
                 "with --nodes: round_robin, or prefix (to the node whose KV events show the "
                 "longest cached prefix; each kvtierd needs --events-address)")
      ->check(CLI::IsMember({"round_robin", "prefix"}))
      ->needs(nodes_opt)
      ->capture_default_str();
  auto* sweep_opt =
      app.add_option("--sweep", sweep_text,
                     "dram=A,B,...[,nvme=X,Y,...]: byte sizes (1536MiB, 2GiB, bytes) as for "
                     "kvtierd --dram-bytes/--nvme-bytes; a fresh kvtierd a point")
          ->excludes(socket_opt)
          ->excludes(json_opt)
          ->excludes(nodes_opt);
  app.add_option("--csv", csv_path, "with --sweep: the CSV to write (a row a point)")
      ->needs(sweep_opt);
  app.add_option("--png", png_path, "with --sweep: the plot (default: the CSV's name, .png)")
      ->needs(sweep_opt);
  app.add_flag("--no-plot", no_plot, "with --sweep: the CSV alone")->needs(sweep_opt);
  app.add_option("--plot-script", plot_script, "with --sweep: the gnuplot script")
      ->needs(sweep_opt)
      ->capture_default_str();
  app.add_option("--kvtierd", kvtierd_path, "with --sweep: the kvtierd to start")
      ->needs(sweep_opt)
      ->capture_default_str();
  std::vector<std::string> kvtierd_args;
  app.add_option("--kvtierd-arg", kvtierd_args,
                 "with --sweep: one more argument for each kvtierd, repeatable, in the = form "
                 "(--kvtierd-arg=--dram-eviction --kvtierd-arg=s3fifo); not --socket, "
                 "--dram-bytes, --nvme-bytes, --nvme-path or --metrics-address, which the sweep "
                 "gives")
      ->needs(sweep_opt)
      ->allow_extra_args(false);
  app.add_option("--nvme-dir", nvme_dir,
                 "with --sweep and nvme=: where the NVMe files go (O_DIRECT: not tmpfs; "
                 "default: the CSV's folder)")
      ->needs(sweep_opt);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help exits 0; usage errors exit 2
  }
  ro.deadline = std::chrono::milliseconds(deadline_ms);

  if (trace_path.empty() && generate == 0) {
    std::fprintf(stderr, "kvtier-replay: give --trace FILE or --generate N\n");
    return 2;
  }
  std::optional<kvtier::replay::SweepSpec> sweep;
  if (!sweep_text.empty()) {
    auto parsed = kvtier::replay::ParseSweep(sweep_text);
    if (!parsed.ok()) {
      std::fprintf(stderr, "kvtier-replay: %s\n", parsed.status().message().c_str());
      return 2;
    }
    sweep = *parsed;
    if (csv_path.empty()) {
      std::fprintf(stderr, "kvtier-replay: --sweep needs --csv FILE\n");
      return 2;
    }
    if (int rc = CheckWritable("--csv", csv_path); rc != 0) return rc;
    if (png_path.empty() && !no_plot) png_path = fs::path(csv_path).replace_extension(".png");
    if (no_plot) png_path.clear();
    if (!png_path.empty()) {
      if (int rc = CheckWritable("--png", png_path); rc != 0) return rc;
    }
  }
  if (!json_path.empty() && json_path != "-") {  // before the run, not after it
    if (int rc = CheckWritable("--json", json_path); rc != 0) return rc;
  }
  std::vector<kvtier::tools::TraceRequest> trace;
  if (!trace_path.empty()) {
    auto loaded = kvtier::tools::LoadMooncakeTrace(trace_path, limit);
    if (!loaded.ok()) {
      std::fprintf(stderr, "kvtier-replay: %s\n", loaded.status().message().c_str());
      return 2;
    }
    trace = std::move(loaded).value();
    if (trace.empty()) {
      std::fprintf(stderr, "kvtier-replay: trace %s holds no requests\n", trace_path.c_str());
      return 2;
    }
  } else {
    trace = kvtier::tools::GenerateMultiTurnTrace(generate, 42);
  }
  const bool show_progress = progress_flag || (!quiet && isatty(STDERR_FILENO));
  const kvtier::replay::ReplayFn replay = [&](const ReplayOptions& o,
                                              std::span<const kvtier::tools::TraceRequest> tr,
                                              Progress& p, Totals& t) {
    return at_rate ? kvtier::replay::ReplayAtTraceTimes(o, rate, tr, p, t)
                   : kvtier::replay::ReplayClosedLoop(o, tr, p, t);
  };
  const std::string trace_name = trace_path.empty() ? "built-in multi-turn generator" : trace_path;

  if (sweep) {
    kvtier::replay::SweepOptions so;
    so.kvtierd_path = kvtierd_path;
    so.kvtierd_args = kvtierd_args;
    so.csv_path = csv_path;
    so.png_path = png_path;
    so.plot_script = plot_script;
    const fs::path csv_dir = fs::path(csv_path).parent_path();
    so.nvme_dir = !nvme_dir.empty() ? nvme_dir : csv_dir.empty() ? "." : csv_dir.string();
    so.title = fs::path(trace_name).filename().string() + ", " + std::to_string(trace.size()) +
               " requests, model " + ro.model + ", " + std::to_string(ro.chunk_tokens) +
               "-token chunks" + (at_rate ? ", at trace times" : "");
    for (size_t i = 0; i < kvtierd_args.size(); ++i) {  // what the daemons ran with
      so.title += (i == 0 ? ", kvtierd " : " ") + kvtierd_args[i];
    }
    std::replace(so.title.begin(), so.title.end(), '\'', ' ');
    so.progress = show_progress;
    return kvtier::replay::RunSweep(ro, *sweep, so, trace, replay);
  }

  if (nodes_opt->count() > 0) {  // "" too: ParseNodes names it, not the default socket
    auto sockets = kvtier::replay::ParseNodes(nodes_text);
    if (!sockets.ok()) {
      std::fprintf(stderr, "kvtier-replay: %s\n", sockets.status().message().c_str());
      return 2;
    }
    nodes.sockets = std::move(sockets).value();
    kvtier::replay::RunInfo info;
    info.trace = trace_name;
    info.model = ro.model;
    info.chunk_tokens = ro.chunk_tokens;
    info.prefetch = ro.prefetch;
    info.schedule_delay_ms = ro.schedule_delay_ms;
    return kvtier::replay::RunNodes(ro, nodes, trace, info, show_progress, json_path);
  }

  // NVMe bytes moved during the replay, from the daemon's counters: unknown
  // (null) when either Stats call fails, e.g. a daemon that stopped meanwhile.
  const std::string where = ro.socket_path.empty() ? kvtier::DefaultSocketPath() : ro.socket_path;
  auto admin = kvtier::AdminClient::Connect(
      where, std::max<std::chrono::milliseconds>(ro.deadline, std::chrono::seconds(1)));
  kvtier::AdminClient* const admin_ptr = admin.ok() ? admin->get() : nullptr;
  const kvtier::replay::NvmeBytes nvme_before = kvtier::replay::NvmeCounters(admin_ptr);
  Totals t;
  Progress progress(trace.size(), show_progress, "");
  const auto start = std::chrono::steady_clock::now();
  if (int rc = replay(ro, trace, progress, t); rc != 0) return rc;
  kvtier::replay::RunInfo info;
  info.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const kvtier::replay::NvmeBytes nvme_after = kvtier::replay::NvmeCounters(admin_ptr);
  kvtier::replay::SetNvmeBytes(nvme_before, nvme_after, info);
  info.trace = trace_name;
  info.model = ro.model;
  info.chunk_tokens = ro.chunk_tokens;
  info.prefetch = ro.prefetch;
  info.schedule_delay_ms = ro.schedule_delay_ms;
  info.clients = at_rate ? rate.clients : 0;
  info.speedup = rate.speedup;
  const nlohmann::json j = kvtier::replay::SummaryJson(t, info);
  kvtier::replay::PrintSummary(json_path == "-" ? stderr : stdout, t, info);
  if (int rc = kvtier::replay::WriteJson(json_path, j); rc != 0) return rc;
  return t.verify_errors == 0 ? 0 : 3;
}
