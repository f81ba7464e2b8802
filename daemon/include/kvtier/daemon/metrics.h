// Prometheus metrics: kvtierd's figures (CacheCore::Stats, the same that
// `kvtierctl stats` prints) in the Prometheus text exposition format 0.0.4,
// served over HTTP at /metrics by cpp-httplib on --metrics-address.
//
// Series (every tier-level one labelled tier="hbm"|"dram"|"nvme"; counters end
// in _total and count since kvtierd started; gauges are the value now):
//   kvtier_tier_{capacity_bytes,used_bytes,capacity_chunks,chunks,pinned_chunks,
//                uncommitted_bytes,pending_writes,degraded}           gauges
//   kvtier_tier_{hits,misses,evictions,read_bytes,written_bytes,io_errors,
//                corrupt_reads,skipped_writes,lost_writes,throttled_writes}_total
//   kvtier_{lookups,ring_lookups,ring_calls,lookup_tokens,hit_tokens,
//           prefetched_chunks,session_limited}_total
//   kvtier_{sessions,active_leases,active_reservations,active_prefetches,
//           uptime_seconds}                                           gauges
//   kvtier_{lookup,load,store,promotion,nvme_read,nvme_write}_seconds histograms
//     (buckets of LatencyHistogram::kBounds; what each times: core::Latencies)
// What each figure means: README.md, "kvtierctl stats".
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "kvtier/daemon/core_calls.h"
#include "kvtier/status.h"

namespace httplib {
class Server;
}

namespace kvtier {

// `stats` and `latencies` as a /metrics page (text format 0.0.4, each family
// with HELP and TYPE).
std::string PrometheusText(const core::StatsResponse& stats, const core::Latencies& latencies);

// Where /metrics listens: "HOST:PORT" (an IPv4 address or a name; an IPv6
// address in brackets, "[::1]:9400"), port 0..65535 (0: any free port), or
// "off". `port` is -1 for "off". Errors: INVALID_ARGUMENT naming what is wrong.
struct MetricsAddress {
  std::string host;
  int port = -1;
  bool off() const { return port < 0; }
};
Result<MetricsAddress> ParseMetricsAddress(std::string_view text);

// An HTTP server of 4 worker threads answering GET /metrics with `render()`
// (other paths: 404); a connection that sends nothing for 1 s is closed.
// Thread-safety: `render` runs on those threads, several at once.
class MetricsServer {
 public:
  // Binds and starts serving. Errors: UNAVAILABLE when it cannot listen there.
  static Result<std::unique_ptr<MetricsServer>> Start(const MetricsAddress& address,
                                                      std::function<std::string()> render);
  ~MetricsServer();  // stops and joins
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // The port it listens on (the one chosen when the address said 0).
  int port() const { return port_; }

 private:
  MetricsServer() = default;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace kvtier
