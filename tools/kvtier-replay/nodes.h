// kvtier-replay --nodes: the trace across several kvtierd ("nodes", usually
// sharing one remote tier), each request sent to one node by a router:
//   round_robin  request i to node i mod N;
//   prefix       to the node whose KV events (kvtierd --events-address) say
//                it holds the longest leading run of the request's chunks, in
//                any tier, among the nodes at most max(8, a quarter) requests
//                ahead of the least loaded one (so that a prefix all prompts
//                share does not draw every request to one node); ties and
//                misses go to the least loaded. The events are what a
//                cache-aware router built for vLLM's stream would see: the
//                router reads no other state of the nodes.
// Closed loop: one request at a time, in trace order.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvtier/status.h"
#include "kvtier/tools/trace.h"
#include "progress.h"
#include "replay.h"
#include "summary.h"

namespace kvtier::replay {

struct NodesOptions {
  std::vector<std::string> sockets;   // one per node, at least one
  std::string route = "round_robin";  // round_robin | prefix
};

// "a.sock,b.sock": the sockets. Errors: INVALID_ARGUMENT (an empty item, a
// socket named twice).
Result<std::vector<std::string>> ParseNodes(const std::string& text);

// What each node served, and the events the prefix router read.
struct NodesResult {
  std::vector<Totals> nodes;       // by node, in --nodes order
  std::vector<uint64_t> requests;  // requests routed to each node
  uint64_t events = 0;             // KV events the prefix router applied
  uint64_t event_gaps = 0;         // batches it saw missing (sequence gaps)
  uint64_t routed_by_prefix = 0;   // requests the events placed (not a tie or a miss)
};

// Replays `trace` over the nodes (options.socket_path is ignored). Returns 0,
// or the exit code of the failure (printed): 1 a node unreachable or a call
// failed, 2 a node's model or namespace refused, or (prefix) a node without
// --events-address.
int ReplayNodes(const ReplayOptions& options, const NodesOptions& nodes,
                std::span<const tools::TraceRequest> trace, Progress& progress,
                NodesResult& result);

// ReplayNodes, then the table (each node's requests, token hit rate, remote
// hit tokens, bytes loaded and stored; the total's summary) on stdout and the
// JSON to `json_path` ("-": stdout, the table then on stderr). Exit code as
// ReplayNodes, or 3 when a loaded byte was wrong.
int RunNodes(const ReplayOptions& options, const NodesOptions& nodes,
             std::span<const tools::TraceRequest> trace, RunInfo info, bool show_progress,
             const std::string& json_path);

}  // namespace kvtier::replay
