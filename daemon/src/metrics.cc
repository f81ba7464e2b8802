#include "kvtier/daemon/metrics.h"

#include <httplib.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <string_view>
#include <utility>

namespace kvtier {
namespace {

using core::StatsResponse;
using core::TierStats;

struct TierSeries {
  const char* name;  // after kvtier_tier_
  bool counter;
  const char* help;
  uint64_t (*value)(const TierStats&);
};

// In the order of kvtierctl stats --json's tier fields.
constexpr TierSeries kTierSeries[] = {
    {"capacity_bytes", false, "Bytes the tier can hold.",
     [](const TierStats& t) { return t.capacity_bytes; }},
    {"used_bytes", false, "Bytes of the tier's slots holding chunks.",
     [](const TierStats& t) { return t.used_bytes; }},
    {"capacity_chunks", false, "Chunks the tier can hold at its namespaces' slot sizes.",
     [](const TierStats& t) { return t.capacity_chunks; }},
    {"chunks", false, "Chunks in the tier.", [](const TierStats& t) { return t.chunks; }},
    {"hits", true,
     "Chunks leased from the tier, once per engine request (those whose Lookup "
     "answer never reached the client too: see kvtier_tier_unserved_hits_total).",
     [](const TierStats& t) { return t.hits + t.unserved_hits; }},
    {"unserved_hits", true,
     "Of kvtier_tier_hits_total, chunks whose Lookup answer never "
     "reached the client (its deadline passed first).",
     [](const TierStats& t) { return t.unserved_hits; }},
    // Not a counter: a later Lookup of the same engine request may serve chunks
    // counted here, and an unserved lease adds them back.
    {"misses", false,
     "dram: full chunks of the engine requests looked up that no tier served "
     "so far (goes down when a later lookup of a request serves them); "
     "remote: images read that the store did not hold or that failed "
     "verification.",
     [](const TierStats& t) { return t.misses; }},
    {"evictions", true, "Chunks the tier evicted to make room.",
     [](const TierStats& t) { return t.evictions; }},
    {"read_bytes", true,
     "Payload bytes read from the tier (dram, hbm: leased to clients, "
     "unserved leases too; nvme, remote: promoted into DRAM).",
     [](const TierStats& t) { return t.read_bytes + t.unserved_read_bytes; }},
    {"unserved_read_bytes", true,
     "Of kvtier_tier_read_bytes_total, bytes of leases whose "
     "Lookup answer never reached the client.",
     [](const TierStats& t) { return t.unserved_read_bytes; }},
    {"written_bytes", true, "Payload bytes written into the tier.",
     [](const TierStats& t) { return t.write_bytes; }},
    {"pending_writes", false,
     "Writes into the tier queued or in flight (nvme: NVMe writes; "
     "hbm: copies into the pool).",
     [](const TierStats& t) { return t.pending_writes; }},
    {"corrupt_reads", true, "Reads that failed verification (counted as misses).",
     [](const TierStats& t) { return t.corrupt_reads; }},
    {"io_errors", true, "I/O operations that failed.",
     [](const TierStats& t) { return t.io_errors; }},
    {"skipped_writes", true,
     "Chunks evicted from DRAM before their NVMe write (remote: "
     "images not written or read because the tier was degraded).",
     [](const TierStats& t) { return t.skipped_writes; }},
    {"lost_writes", true,
     "NVMe writes that failed or were dropped at shutdown (remote: "
     "images the store did not take).",
     [](const TierStats& t) { return t.lost_writes; }},
    {"throttled_writes", true, "Stores dropped because the NVMe writer was behind.",
     [](const TierStats& t) { return t.throttled_writes; }},
    {"pinned_chunks", false, "Chunks pinned by leases, prefetches or writes.",
     [](const TierStats& t) { return t.pinned_chunks; }},
    {"uncommitted_bytes", false, "Bytes reserved by writes not yet committed.",
     [](const TierStats& t) { return t.uncommitted_bytes; }},
    {"degraded", false, "1 while the tier is degraded (its misses are misses, DRAM serves).",
     [](const TierStats& t) { return uint64_t{t.degraded}; }},
};

struct DaemonSeries {
  const char* name;  // after kvtier_
  bool counter;
  const char* help;
  uint64_t (*value)(const StatsResponse&);
};

constexpr DaemonSeries kDaemonSeries[] = {
    {"lookups", true, "Lookup calls.", [](const StatsResponse& s) { return s.lookups; }},
    {"ring_lookups", true, "Lookup calls that came over a control ring and succeeded.",
     [](const StatsResponse& s) { return s.ring_lookups; }},
    {"ring_calls", true, "Calls of every kind that came over a control ring.",
     [](const StatsResponse& s) { return s.ring_calls; }},
    {"lookup_tokens", true, "Prompt tokens looked up, once per engine request.",
     [](const StatsResponse& s) { return s.lookup_tokens; }},
    {"lookup_chunks", true,
     "Full chunks of the prompt tokens looked up, once per engine "
     "request.",
     [](const StatsResponse& s) { return s.lookup_chunks; }},
    {"hit_tokens", true,
     "Prompt tokens leased from a tier, once per engine request (those "
     "whose Lookup answer never reached the client too: see "
     "kvtier_unserved_hit_tokens_total).",
     [](const StatsResponse& s) { return s.hit_tokens + s.unserved_hit_tokens; }},
    {"unserved_hit_tokens", true,
     "Of kvtier_hit_tokens_total, tokens whose Lookup answer "
     "never reached the client (its deadline passed first).",
     [](const StatsResponse& s) { return s.unserved_hit_tokens; }},
    {"prefetched_chunks", true, "Chunks promoted by a prefetch and leased in time.",
     [](const StatsResponse& s) { return s.prefetched_chunks; }},
    {"session_limited", true, "Calls cut short by session_max_bytes.",
     [](const StatsResponse& s) { return s.session_limited; }},
    {"sessions", false, "Client sessions open.", [](const StatsResponse& s) { return s.sessions; }},
    {"active_leases", false, "Read leases held.",
     [](const StatsResponse& s) { return s.active_leases; }},
    {"active_reservations", false, "Writes reserved and not yet committed.",
     [](const StatsResponse& s) { return s.active_reservations; }},
    {"active_prefetches", false, "Prefetch tickets held.",
     [](const StatsResponse& s) { return s.active_prefetches; }},
    {"uptime_seconds", false, "Seconds since kvtierd started.",
     [](const StatsResponse& s) { return s.uptime_s; }},
};

struct HistogramSeries {
  const char* name;  // between kvtier_ and _seconds
  const char* help;
  LatencyHistogram::Snapshot core::Latencies::*value;
};

constexpr HistogramSeries kHistograms[] = {
    {"lookup", "Lookup calls, request in to response out (with any NVMe promotion waited for).",
     &core::Latencies::lookup},
    {"load",
     "Read leases, granted to released (the client's copy out and whatever else it "
     "does meanwhile; leases that lapse or whose client dies are not counted).",
     &core::Latencies::load},
    {"store", "Writes, reserved to committed: the client's copy into the arena.",
     &core::Latencies::store},
    {"promotion", "Promotions from NVMe into DRAM, started to done.", &core::Latencies::promotion},
    {"nvme_read", "Batches of NVMe reads (one promotion step).", &core::Latencies::nvme_read},
    {"nvme_write", "Batches of NVMe writes.", &core::Latencies::nvme_write},
};

void Family(std::string& out, const std::string& name, const char* type, const char* help) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

// A label value as the text format quotes it: backslash, double quote and
// line feed escaped (a model id is a client's UTF-8 text).
std::string LabelValue(std::string_view v) {
  std::string out = "\"";
  for (char c : v) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out + "\"";
}

uint64_t OfTier(const core::TierTokens& t, std::string_view tier) {
  return tier == "hbm" ? t.hbm : tier == "dram" ? t.dram : tier == "nvme" ? t.nvme : t.remote;
}

// Tokens by model (labels bounded by kMaxModelLabels) and prefetch outcomes.
void ModelAndPrefetchSeries(std::string& out, const StatsResponse& stats) {
  std::string name = "kvtier_model_lookup_tokens_total";
  Family(out, name, "counter",
         "Prompt tokens looked up, once per engine request, by model "
         "(a namespace's model_id; past 64 models, \"_other\").");
  for (const core::ModelStats& m : stats.models) {
    out +=
        name + "{model=" + LabelValue(m.model_id) + "} " + std::to_string(m.lookup_tokens) + "\n";
  }
  for (const bool unserved : {false, true}) {
    name = unserved ? "kvtier_model_unserved_hit_tokens_total" : "kvtier_model_hit_tokens_total";
    Family(out, name, "counter",
           unserved ? "Of kvtier_model_hit_tokens_total, tokens whose Lookup answer never "
                      "reached the client."
                    : "Prompt tokens leased, once per engine request, by model and by the "
                      "tier they were leased from (unserved ones too).");
    for (const core::ModelStats& m : stats.models) {
      for (const TierStats& t : stats.tiers) {
        const uint64_t v =
            OfTier(m.unserved_hit_tokens, t.name) + (unserved ? 0 : OfTier(m.hit_tokens, t.name));
        out += name + "{model=" + LabelValue(m.model_id) + ",tier=\"" + t.name + "\"} " +
               std::to_string(v) + "\n";
      }
    }
  }
  name = "kvtier_prefetches_total";
  Family(out, name, "counter",
         "Prefetch calls by how they ended: used (a Lookup took the "
         "ticket over after its promotion finished), used_early (before), "
         "expired, session_ended, nothing_cached, over_budget (no ticket).");
  const core::PrefetchOutcomes& p = stats.prefetches;
  const std::pair<const char*, uint64_t> outcomes[] = {{"used", p.used},
                                                       {"used_early", p.used_early},
                                                       {"expired", p.expired},
                                                       {"session_ended", p.session_ended},
                                                       {"nothing_cached", p.nothing_cached},
                                                       {"over_budget", p.over_budget}};
  for (const auto& [outcome, v] : outcomes) {
    out += name + "{outcome=\"" + outcome + "\"} " + std::to_string(v) + "\n";
  }
}

std::string Number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

constexpr size_t kThreads = 4;

}  // namespace

std::string PrometheusText(const StatsResponse& stats, const core::Latencies& latencies) {
  std::string out;
  out.reserve(8192);
  for (const TierSeries& f : kTierSeries) {
    const std::string name = std::string("kvtier_tier_") + f.name + (f.counter ? "_total" : "");
    Family(out, name, f.counter ? "counter" : "gauge", f.help);
    for (const TierStats& t : stats.tiers) {
      out += name + "{tier=\"" + t.name + "\"} " + std::to_string(f.value(t)) + "\n";
    }
  }
  for (const DaemonSeries& f : kDaemonSeries) {
    const std::string name = std::string("kvtier_") + f.name + (f.counter ? "_total" : "");
    Family(out, name, f.counter ? "counter" : "gauge", f.help);
    out += name + " " + std::to_string(f.value(stats)) + "\n";
  }
  ModelAndPrefetchSeries(out, stats);
  for (const HistogramSeries& h : kHistograms) {
    const std::string name = std::string("kvtier_") + h.name + "_seconds";
    const LatencyHistogram::Snapshot& v = latencies.*h.value;
    Family(out, name, "histogram", h.help);
    uint64_t cumulative = 0;
    for (size_t i = 0; i < LatencyHistogram::kBuckets; ++i) {
      cumulative += v.counts[i];
      const std::string le =
          i < LatencyHistogram::kBounds.size() ? Number(LatencyHistogram::kBounds[i]) : "+Inf";
      out += name + "_bucket{le=\"" + le + "\"} " + std::to_string(cumulative) + "\n";
    }
    out += name + "_sum " + Number(v.sum_seconds) + "\n";
    out += name + "_count " + std::to_string(cumulative) + "\n";
  }
  return out;
}

Result<MetricsAddress> ParseMetricsAddress(std::string_view text) {
  if (text == "off") return MetricsAddress{};
  const std::string shown = "'" + std::string(text) + "'";
  const size_t colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == text.size()) {
    return Status::InvalidArgument(shown + " is not HOST:PORT (e.g. 127.0.0.1:9400) or off");
  }
  std::string_view host = text.substr(0, colon);
  const std::string_view port_text = text.substr(colon + 1);
  if (host.front() == '[') {  // [IPv6]
    if (host.size() < 3 || host.back() != ']') {
      return Status::InvalidArgument(shown + ": an IPv6 address goes in brackets, [::1]:9400");
    }
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != std::string_view::npos) {
    return Status::InvalidArgument(shown + ": put an IPv6 address in brackets, [::1]:9400");
  }
  int port = -1;
  const auto [end, ec] =
      std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || end != port_text.data() + port_text.size() || port < 0 || port > 65535) {
    return Status::InvalidArgument(shown + ": port '" + std::string(port_text) +
                                   "' is not a number in 0..65535");
  }
  return MetricsAddress{std::string(host), port};
}

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(const MetricsAddress& address,
                                                            std::function<std::string()> render) {
  std::unique_ptr<MetricsServer> m(new MetricsServer());
  m->server_ = std::make_unique<httplib::Server>();
  httplib::Server& s = *m->server_;
  // A few threads, each let go by a connection that sends nothing within 1 s,
  // so that idle or slow connections do not hold a scrape up for long.
  s.new_task_queue = [] { return new httplib::ThreadPool(kThreads); };
  s.set_read_timeout(1, 0);
  s.set_write_timeout(1, 0);
  s.set_keep_alive_max_count(1);  // a kept-alive scraper would hold a thread
  // SO_REUSEADDR only (a restart may bind at once), not the default's SO_REUSEPORT,
  // with which a second kvtierd binds the same port and takes half the scrapes.
  s.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  s.Get("/metrics", [render = std::move(render)](const httplib::Request&, httplib::Response& res) {
    res.set_content(render(), "text/plain; version=0.0.4; charset=utf-8");
  });
  m->port_ = address.port == 0 ? s.bind_to_any_port(address.host)
                               : (s.bind_to_port(address.host, address.port) ? address.port : -1);
  if (m->port_ < 0) {
    return Status::Unavailable("cannot listen on " + address.host + ":" +
                               std::to_string(address.port) +
                               " (in use, or not an address of this machine)");
  }
  m->thread_ = std::thread([p = m.get()] {
    if (!p->server_->listen_after_bind()) spdlog::error("metrics server stopped unexpectedly");
  });
  return m;
}

MetricsServer::~MetricsServer() {
  // stop() before the thread has begun listening would be lost: wait (bounded) for it.
  for (int i = 0; i < 1000 && thread_.joinable() && !server_->is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace kvtier
