// kvtier-replay --sweep: one fresh kvtierd a capacity point, the same replay on
// each, a CSV row a point (with the offline LRU and Belady references of
// kvtier/tools/cache_reference.h at the daemon's capacity in chunks), then a
// PNG of token hit rate against capacity drawn by tools/plot-sweep.gp.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/status.h"
#include "kvtier/tools/trace.h"
#include "replay.h"

namespace kvtier::replay {

// The points of a sweep: every DRAM size with every NVMe size (none: DRAM only).
struct SweepSpec {
  std::vector<uint64_t> dram_bytes;
  std::vector<uint64_t> nvme_bytes;
};

// Parses "dram=A,B,C[,nvme=X,Y]": a key starts a list of byte sizes in
// kvtierd's --dram-bytes form ("1536MiB", "2GiB", "1073741824"). Errors:
// INVALID_ARGUMENT naming the bad piece ("dram=": no value; "dram=abc": not a
// byte size; "foo=1": an unknown key; a key twice; no dram list).
Result<SweepSpec> ParseSweep(std::string_view text);

struct SweepOptions {
  std::string kvtierd_path;  // the daemon to start. Default: kvtierd beside kvtier-replay
  std::vector<std::string> kvtierd_args;  // more flags for each daemon (--dram-eviction s3fifo)
  std::string csv_path;                   // one row a point
  std::string png_path;                   // "": no plot
  std::string plot_script;                // gnuplot script: tools/plot-sweep.gp
  std::string nvme_dir;   // parent of each point's NVMe file folder (O_DIRECT: not tmpfs)
  std::string title;      // the plot's title (no single quotes)
  bool progress = false;  // a progress line per point on stderr
};

// Replays `trace` on the daemon at options.socket_path into `t`: 0, or the exit code.
using ReplayFn = std::function<int(const ReplayOptions&, std::span<const tools::TraceRequest>,
                                   Progress&, Totals&)>;

// Runs the sweep; `base` gives model, chunk size and deadlines (its socket is
// replaced by each point's). Prints a line a point on stdout. Returns the exit code.
int RunSweep(const ReplayOptions& base, const SweepSpec& spec, const SweepOptions& options,
             std::span<const tools::TraceRequest> trace, const ReplayFn& replay);

}  // namespace kvtier::replay
