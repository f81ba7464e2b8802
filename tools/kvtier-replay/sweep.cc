#include "sweep.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "kvtier/admin_client.h"
#include "kvtier/tools/cache_reference.h"
#include "kvtier/tools/percentiles.h"
#include "kvtier/units.h"
#include "kvtierd_process.h"

extern char** environ;

namespace kvtier::replay {
namespace {

namespace fs = std::filesystem;
using tools::Percentile;

// A fresh folder `parent`/`prefix`XXXXXX, or "" (errno set).
std::string MakeTempDir(const std::string& parent, const std::string& prefix) {
  std::string templ = (fs::path(parent) / (prefix + "XXXXXX")).string();
  return mkdtemp(templ.data()) == nullptr ? "" : templ;
}

// `name` found on PATH, or "".
std::string FindOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    const size_t end = std::min(dirs.find(':', start), dirs.size());
    const fs::path candidate = fs::path(dirs.substr(start, end - start)) / name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate.string();
    start = end + 1;
  }
  return "";
}

// Runs argv and waits; its exit code, or -1 when it could not start or was killed.
int RunAndWait(const std::vector<std::string>& argv) {
  std::vector<char*> cargv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawn(&pid, cargv[0], nullptr, nullptr, cargv.data(), environ) != 0) return -1;
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

// Draws options.png_path from options.csv_path. Returns false (and says why on
// stderr) when it could not; a missing gnuplot is a note, not a failure.
bool Plot(const SweepOptions& options) {
  const std::string gnuplot = FindOnPath("gnuplot");
  const std::string vars = "csv='" + options.csv_path + "'; png='" + options.png_path +
                           "'; plot_title='" + options.title + "'";
  if (gnuplot.empty()) {
    std::fprintf(stderr,
                 "kvtier-replay: gnuplot not found (Debian: gnuplot-nox, in "
                 "tools/install-deps.sh); no PNG. Draw it later with:\n  gnuplot -e \"%s\" %s\n",
                 vars.c_str(), options.plot_script.c_str());
    return true;
  }
  if (access(options.plot_script.c_str(), R_OK) != 0) {
    std::fprintf(stderr, "kvtier-replay: plot script %s not found (give --plot-script)\n",
                 options.plot_script.c_str());
    return false;
  }
  const int rc = RunAndWait({gnuplot, "-e", vars, options.plot_script});
  if (rc != 0) {
    std::fprintf(stderr, "kvtier-replay: %s %s failed (exit %d)\n", gnuplot.c_str(),
                 options.plot_script.c_str(), rc);
    return false;
  }
  std::fprintf(stderr, "kvtier-replay: plot written to %s\n", options.png_path.c_str());
  return true;
}

// The daemon's capacity in chunks of the namespace opened (dram, nvme).
std::pair<uint64_t, uint64_t> CapacityChunks(const std::string& socket) {
  std::pair<uint64_t, uint64_t> out{0, 0};
  auto admin = AdminClient::Connect(socket, std::chrono::seconds(5));
  if (!admin.ok()) return out;
  auto s = (*admin)->Stats();
  if (!s.ok()) return out;
  for (const auto& tier : s->tiers) {
    if (tier.name == "dram") out.first = tier.capacity_chunks;
    if (tier.name == "nvme") out.second = tier.capacity_chunks;
  }
  return out;
}

struct Point {
  uint64_t dram_bytes = 0, nvme_bytes = 0;
};

}  // namespace

Result<SweepSpec> ParseSweep(std::string_view text) {
  SweepSpec spec;
  std::vector<uint64_t>* current = nullptr;
  bool dram_seen = false, nvme_seen = false;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find(',', start), text.size());
    const std::string piece(text.substr(start, end - start));
    start = end + 1;
    std::string value = piece;
    if (const size_t eq = piece.find('='); eq != std::string::npos) {
      const std::string key = piece.substr(0, eq);
      value = piece.substr(eq + 1);
      bool* seen = key == "dram" ? &dram_seen : key == "nvme" ? &nvme_seen : nullptr;
      if (seen == nullptr) {
        return Status::InvalidArgument("--sweep: unknown key '" + key + "' in '" + piece +
                                       "' (known: dram, nvme)");
      }
      if (*seen) return Status::InvalidArgument("--sweep: '" + key + "=' is given twice");
      *seen = true;
      current = key == "dram" ? &spec.dram_bytes : &spec.nvme_bytes;
    } else if (current == nullptr) {
      return Status::InvalidArgument("--sweep: '" + piece +
                                     "' comes before any key (give dram=A,B,... first)");
    }
    if (value.empty()) {
      return Status::InvalidArgument("--sweep: '" + piece +
                                     "' gives no value (a byte size such as 1536MiB)");
    }
    auto bytes = ParseBytes(value);
    if (!bytes.ok()) {
      return Status::InvalidArgument("--sweep: '" + value + "' in '" + std::string(text) +
                                     "' is not a byte size (such as 1536MiB, 2GiB or "
                                     "1073741824)");
    }
    current->push_back(*bytes);
  }
  if (spec.dram_bytes.empty()) {
    return Status::InvalidArgument("--sweep: no dram= sizes in '" + std::string(text) + "'");
  }
  return spec;
}

namespace {

// What every point of one sweep shares.
struct SweepRun {
  const ReplayOptions& base;
  const SweepOptions& options;
  std::span<const tools::TraceRequest> trace;
  std::vector<tools::ChunkedRequest> chunked;  // for the offline references
  const ReplayFn& replay;
  std::string work;  // sockets and daemon logs
  std::ofstream& csv;
};

// kvtierd's arguments for point `p`; its NVMe folder (made here) in *nvme_dir.
Result<std::vector<std::string>> DaemonArgs(const SweepRun& run, const Point& p,
                                            std::string* nvme_dir) {
  std::vector<std::string> args = {"--dram-bytes", std::to_string(p.dram_bytes)};
  args.insert(args.end(), run.options.kvtierd_args.begin(), run.options.kvtierd_args.end());
  if (p.nvme_bytes == 0) {
    args.insert(args.end(), {"--nvme-bytes", "0"});
    return args;
  }
  *nvme_dir = MakeTempDir(run.options.nvme_dir, "kvtier-sweep-nvme.");
  if (nvme_dir->empty()) {
    return Status::FromErrno(errno, "a folder under " + run.options.nvme_dir);
  }
  args.insert(args.end(), {"--nvme-path", *nvme_dir, "--nvme-bytes", std::to_string(p.nvme_bytes)});
  return args;
}

// Point `i`: a fresh daemon, the replay, the daemon stopped, a CSV row and a
// line on stdout. Returns 0, 3 (verify errors; the row is written) or the
// exit code of a failure (printed).
int RunPoint(SweepRun& run, size_t i, const Point& p) {
  std::string nvme_dir;
  auto args = DaemonArgs(run, p, &nvme_dir);
  if (!args.ok()) {
    std::fprintf(stderr, "kvtier-replay: %s\n", args.status().message().c_str());
    return 1;
  }
  std::string label = "dram=" + FormatBytes(p.dram_bytes);
  if (p.nvme_bytes > 0) label += " nvme=" + FormatBytes(p.nvme_bytes);
  ReplayOptions o = run.base;
  o.socket_path = run.work + "/p" + std::to_string(i) + ".sock";
  auto daemon =
      KvtierdProcess::Start(run.options.kvtierd_path, o.socket_path, *args,
                            run.work + "/p" + std::to_string(i) + ".log", std::chrono::seconds(60));
  if (!daemon.ok()) {
    std::fprintf(stderr, "kvtier-replay: %s: %s\n", label.c_str(),
                 daemon.status().message().c_str());
    return 1;
  }
  Progress progress(run.trace.size(), run.options.progress, label);
  Totals t;
  const auto t0 = std::chrono::steady_clock::now();
  int rc = run.replay(o, run.trace, progress, t);
  const double wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto [dram_chunks, nvme_chunks] = CapacityChunks(o.socket_path);
  if (Status s = (*daemon)->Stop(); !s.ok() && rc == 0) {
    std::fprintf(stderr, "kvtier-replay: %s\n", s.message().c_str());
    rc = 1;
  }
  std::error_code ec;
  if (!nvme_dir.empty()) fs::remove_all(nvme_dir, ec);
  if (rc != 0) return rc;
  // The references hold as many chunks as the tiers together.
  const uint64_t chunks = dram_chunks + nvme_chunks;
  const uint32_t ct = run.base.chunk_tokens;
  const double lru = tools::SimulateLru(run.chunked, chunks, ct).TokenHitRate();
  const double opt = tools::SimulateBelady(run.chunked, chunks, ct).TokenHitRate();
  const auto u = [](uint64_t v) { return static_cast<unsigned long long>(v); };
  const double lookup50 = Percentile(t.lookup_us, 50), lookup99 = Percentile(t.lookup_us, 99);
  const double load50 = Percentile(t.load_us, 50), load99 = Percentile(t.load_us, 99);
  char row[512];
  std::snprintf(row, sizeof row,
                "%llu,%llu,%llu,%llu,%llu,%llu,%llu,%.6f,%.0f,%.0f,%.0f,%.0f,%llu,%.6f,%.6f,%.2f\n",
                u(p.dram_bytes), u(p.nvme_bytes), u(chunks), u(chunks * ct), u(t.requests),
                u(t.prompt_tokens), u(t.hit_tokens), t.HitRate(), lookup50, lookup99, load50,
                load99, u(t.verify_errors), lru, opt, wall_s);
  run.csv << row << std::flush;
  std::printf(
      "%s: %llu chunks, %llu requests, token hit rate %.4f (LRU %.4f, Belady %.4f), "
      "lookup p50/p99 %.0f/%.0f us, load p50/p99 %.0f/%.0f us, %.1f s\n",
      label.c_str(), u(chunks), u(t.requests), t.HitRate(), lru, opt, lookup50, lookup99, load50,
      load99, wall_s);
  std::fflush(stdout);
  return t.verify_errors == 0 ? 0 : 3;
}

}  // namespace

int RunSweep(const ReplayOptions& base, const SweepSpec& spec, const SweepOptions& options,
             std::span<const tools::TraceRequest> trace, const ReplayFn& replay) {
  std::vector<Point> points;
  for (uint64_t d : spec.dram_bytes) {
    if (spec.nvme_bytes.empty()) points.push_back({d, 0});
    for (uint64_t n : spec.nvme_bytes) points.push_back({d, n});
  }
  std::ofstream csv(options.csv_path);
  if (!csv) {
    std::fprintf(stderr, "kvtier-replay: cannot write %s\n", options.csv_path.c_str());
    return 2;
  }
  csv << "dram_bytes,nvme_bytes,capacity_chunks,capacity_tokens,requests,prompt_tokens,"
         "hit_tokens,token_hit_rate,lookup_p50_us,lookup_p99_us,load_p50_us,load_p99_us,"
         "verify_errors,lru_hit_rate,belady_hit_rate,wall_s\n";
  const char* tmp = std::getenv("TMPDIR");
  SweepRun run{base,   options,
               trace,  tools::ChunkTrace(trace, base.chunk_tokens),
               replay, MakeTempDir(tmp && *tmp ? tmp : "/tmp", "kvtier-sweep."),
               csv};
  if (run.work.empty()) {
    std::perror("kvtier-replay: a temporary folder");
    return 1;
  }
  int rc = 0;  // 3 (verify errors at some point) does not stop the sweep
  for (size_t i = 0; i < points.size() && (rc == 0 || rc == 3); ++i) {
    const int point_rc = RunPoint(run, i, points[i]);
    if (point_rc != 0) rc = point_rc;  // a failure (1, 2) ends the sweep; 3 goes on
  }
  std::error_code ec;
  if (rc == 0 || rc == 3) {
    fs::remove_all(run.work, ec);
  } else {
    std::fprintf(stderr, "kvtier-replay: daemon logs kept in %s\n", run.work.c_str());
  }
  csv.close();
  if (!csv) {
    std::fprintf(stderr, "kvtier-replay: cannot write %s\n", options.csv_path.c_str());
    return 1;
  }
  if ((rc == 0 || rc == 3) && !options.png_path.empty() && !Plot(options)) return 1;
  return rc;
}

}  // namespace kvtier::replay
