// kvtierctl stats (once, or --watch: rates between samples) and flush (waits
// for the NVMe tier's pending writes to drain).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "ctl.h"
#include "kvtier/tools/table_cell.h"
#include "kvtier/units.h"

namespace kvtier::ctl {

using nlohmann::json;
using SteadyTime = std::chrono::steady_clock::time_point;

json StatsJson(const DaemonStats& s) {
  json tiers = json::array();
  for (const auto& t : s.tiers) {
    tiers.push_back({{"name", t.name},
                     {"capacity_bytes", t.capacity_bytes},
                     {"used_bytes", t.used_bytes},
                     {"capacity_chunks", t.capacity_chunks},
                     {"chunks", t.chunks},
                     {"hits", t.hits},
                     {"misses", t.misses},
                     {"evictions", t.evictions},
                     {"read_bytes", t.read_bytes},
                     {"write_bytes", t.write_bytes},
                     {"pending_writes", t.pending_writes},
                     {"corrupt_reads", t.corrupt_reads},
                     {"io_errors", t.io_errors},
                     {"skipped_writes", t.skipped_writes},
                     {"lost_writes", t.lost_writes},
                     {"throttled_writes", t.throttled_writes},
                     {"pinned_chunks", t.pinned_chunks},
                     {"uncommitted_bytes", t.uncommitted_bytes},
                     {"degraded", t.degraded},
                     {"unserved_hits", t.unserved_hits},
                     {"unserved_read_bytes", t.unserved_read_bytes}});
  }
  const auto tier_tokens = [](const TierTokens& t) {
    return json{{"hbm", t.hbm}, {"dram", t.dram}, {"nvme", t.nvme}, {"remote", t.remote}};
  };
  json models = json::array();
  for (const auto& m : s.models) {
    const uint64_t hit = m.hit_tokens.total();
    models.push_back({{"model_id", m.model_id},
                      {"lookup_tokens", m.lookup_tokens},
                      {"hit_tokens", tier_tokens(m.hit_tokens)},
                      {"unserved_hit_tokens", tier_tokens(m.unserved_hit_tokens)},
                      {"token_hit_rate", m.lookup_tokens ? double(hit) / m.lookup_tokens : 0.0}});
  }
  const PrefetchOutcomes& p = s.prefetches;
  return {{"tiers", tiers},
          {"models", models},
          {"prefetches",
           {{"nothing_cached", p.nothing_cached},
            {"over_budget", p.over_budget},
            {"used", p.used},
            {"used_early", p.used_early},
            {"expired", p.expired},
            {"session_ended", p.session_ended}}},
          {"lookup_chunks", s.lookup_chunks},
          {"unserved_hit_tokens", s.unserved_hit_tokens},
          {"lookups", s.lookups},
          {"ring_lookups", s.ring_lookups},
          {"ring_calls", s.ring_calls},
          {"lookup_tokens", s.lookup_tokens},
          {"hit_tokens", s.hit_tokens},
          {"token_hit_rate", s.lookup_tokens ? double(s.hit_tokens) / s.lookup_tokens : 0.0},
          {"sessions", s.sessions},
          {"active_leases", s.active_leases},
          {"active_reservations", s.active_reservations},
          {"active_prefetches", s.active_prefetches},
          {"prefetched_chunks", s.prefetched_chunks},
          {"session_limited", s.session_limited},
          {"uptime_s", s.uptime_s}};
}

void PrintStats(const DaemonStats& s) {
  std::printf("%-6s %12s %12s %10s %10s %10s %10s %10s %12s %12s\n", "tier", "capacity", "used",
              "cap_chunks", "chunks", "hits", "misses", "evictions", "read", "written");
  for (const auto& t : s.tiers) {
    std::printf("%-6s %12s %12s %10llu %10llu %10llu %10llu %10llu %12s %12s\n", t.name.c_str(),
                FormatBytes(t.capacity_bytes).c_str(), FormatBytes(t.used_bytes).c_str(),
                static_cast<unsigned long long>(t.capacity_chunks),
                static_cast<unsigned long long>(t.chunks), static_cast<unsigned long long>(t.hits),
                static_cast<unsigned long long>(t.misses),
                static_cast<unsigned long long>(t.evictions), FormatBytes(t.read_bytes).c_str(),
                FormatBytes(t.write_bytes).c_str());
  }
  std::printf(
      "lookups %llu (%llu over the control ring), lookup tokens %llu, hit tokens %llu "
      "(token hit rate %.4f)\n",
      static_cast<unsigned long long>(s.lookups), static_cast<unsigned long long>(s.ring_lookups),
      static_cast<unsigned long long>(s.lookup_tokens),
      static_cast<unsigned long long>(s.hit_tokens),
      s.lookup_tokens ? double(s.hit_tokens) / s.lookup_tokens : 0.0);
  std::printf("sessions %llu, active leases %llu, active reservations %llu, uptime %llu s\n",
              static_cast<unsigned long long>(s.sessions),
              static_cast<unsigned long long>(s.active_leases),
              static_cast<unsigned long long>(s.active_reservations),
              static_cast<unsigned long long>(s.uptime_s));
  std::printf(
      "active prefetches %llu, chunks prefetched from NVMe %llu, calls cut short by "
      "the session limit %llu\n",
      static_cast<unsigned long long>(s.active_prefetches),
      static_cast<unsigned long long>(s.prefetched_chunks),
      static_cast<unsigned long long>(s.session_limited));
  const PrefetchOutcomes& p = s.prefetches;
  std::printf(
      "prefetches: used %llu, used early %llu (before their promotion finished), "
      "expired %llu, session ended %llu, nothing cached %llu, over budget %llu\n",
      static_cast<unsigned long long>(p.used), static_cast<unsigned long long>(p.used_early),
      static_cast<unsigned long long>(p.expired), static_cast<unsigned long long>(p.session_ended),
      static_cast<unsigned long long>(p.nothing_cached),
      static_cast<unsigned long long>(p.over_budget));
  if (s.unserved_hit_tokens > 0) {
    std::printf("hit tokens leased but never answered (client deadline passed): %llu\n",
                static_cast<unsigned long long>(s.unserved_hit_tokens));
  }
  if (s.models.empty()) return;
  std::printf("%-40s %14s %14s %14s %14s %14s %8s\n", "model", "lookup_tokens", "hbm_hits",
              "dram_hits", "nvme_hits", "remote_hits", "hit_rate");
  for (const auto& m : s.models) {
    const uint64_t hit = m.hit_tokens.total();
    std::printf("%s %14llu %14llu %14llu %14llu %14llu %8.4f\n",
                tools::Cell(m.model_id, 40).c_str(),
                static_cast<unsigned long long>(m.lookup_tokens),
                static_cast<unsigned long long>(m.hit_tokens.hbm),
                static_cast<unsigned long long>(m.hit_tokens.dram),
                static_cast<unsigned long long>(m.hit_tokens.nvme),
                static_cast<unsigned long long>(m.hit_tokens.remote),
                m.lookup_tokens ? double(hit) / m.lookup_tokens : 0.0);
  }
}

namespace {

// b - a, or b when the counter went back (kvtierd restarted between samples).
uint64_t Delta(uint64_t a, uint64_t b) { return b >= a ? b - a : b; }

const TierStats* FindTier(const DaemonStats& s, const std::string& name) {
  for (const TierStats& t : s.tiers) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

// The rates between samples `a` and `b`, taken `dt_s` seconds apart.
json Rates(const DaemonStats& a, const DaemonStats& b, double dt_s) {
  json tiers = json::array();
  for (const TierStats& t : b.tiers) {
    const TierStats* p = FindTier(a, t.name);
    const TierStats zero;
    if (p == nullptr) p = &zero;
    const uint64_t hits = Delta(p->hits, t.hits), rd = Delta(p->read_bytes, t.read_bytes),
                   wr = Delta(p->write_bytes, t.write_bytes);
    tiers.push_back({{"name", t.name},
                     {"hits", hits},
                     {"hits_per_s", hits / dt_s},
                     {"read_bytes", rd},
                     {"read_gb_per_s", rd / 1e9 / dt_s},
                     {"write_bytes", wr},
                     {"write_gb_per_s", wr / 1e9 / dt_s},
                     {"pending_writes", t.pending_writes}});
  }
  const uint64_t lookups = Delta(a.lookups, b.lookups), hit = Delta(a.hit_tokens, b.hit_tokens),
                 looked = Delta(a.lookup_tokens, b.lookup_tokens);
  return {{"interval_s", dt_s},
          {"lookups", lookups},
          {"lookups_per_s", lookups / dt_s},
          {"lookup_tokens", looked},
          {"hit_tokens", hit},
          {"hit_tokens_per_s", hit / dt_s},
          {"token_hit_rate", looked ? double(hit) / looked : 0.0},
          {"tiers", tiers}};
}

void PrintRates(const json& r, uint64_t sample) {
  std::printf("sample %llu, over %.2f s: lookups/s %.1f, hit tokens/s %.1f, token hit rate %.4f\n",
              static_cast<unsigned long long>(sample), r["interval_s"].get<double>(),
              r["lookups_per_s"].get<double>(), r["hit_tokens_per_s"].get<double>(),
              r["token_hit_rate"].get<double>());
  std::printf("%-6s %10s %11s %11s %10s\n", "tier", "hits/s", "read GB/s", "write GB/s", "pending");
  for (const json& t : r["tiers"]) {
    std::printf("%-6s %10.1f %11.3f %11.3f %10llu\n", t["name"].get<std::string>().c_str(),
                t["hits_per_s"].get<double>(), t["read_gb_per_s"].get<double>(),
                t["write_gb_per_s"].get<double>(),
                static_cast<unsigned long long>(t["pending_writes"].get<uint64_t>()));
  }
}

}  // namespace

int RunWatch(AdminClient& admin, const std::string& socket_path, bool as_json, double interval_s,
             uint64_t count) {
  const bool tty = isatty(STDOUT_FILENO) != 0;
  auto prev = admin.Stats();
  if (!prev.ok()) return Fail(socket_path, as_json, prev.status());
  SteadyTime prev_at = std::chrono::steady_clock::now();
  const auto step = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(interval_s));
  SteadyTime next = prev_at + step;
  for (uint64_t sample = 1; count == 0 || sample <= count; ++sample, next += step) {
    std::this_thread::sleep_until(next);
    auto now = admin.Stats();
    if (!now.ok()) return Fail(socket_path, as_json, now.status());
    const SteadyTime at = std::chrono::steady_clock::now();
    const json r = Rates(*prev, *now, std::chrono::duration<double>(at - prev_at).count());
    if (as_json) {
      std::printf("%s\n", r.dump().c_str());  // one object a line
    } else {
      if (tty) std::printf("\033[H\033[2J");  // redraw in place
      PrintRates(r, sample);
      if (!tty) std::printf("\n");
    }
    std::fflush(stdout);
    prev = std::move(now);
    prev_at = at;
  }
  return 0;
}

int RunFlush(AdminClient& admin, const std::string& socket_path, bool as_json, double timeout_s) {
  const SteadyTime start = std::chrono::steady_clock::now();
  const SteadyTime deadline =
      start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                  std::chrono::duration<double>(timeout_s));
  for (;;) {
    auto s = admin.Stats();
    if (!s.ok()) return Fail(socket_path, as_json, s.status());
    const TierStats* nvme = FindTier(*s, "nvme");
    if (nvme == nullptr) {
      return Fail(socket_path, as_json,
                  Status::FailedPrecondition("kvtierd has no NVMe tier (started with "
                                             "--nvme-bytes 0): there is nothing to flush"));
    }
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (nvme->pending_writes == 0) {
      if (as_json) {
        std::printf(
            "%s\n",
            json{{"drained", true}, {"pending_writes", 0}, {"waited_s", waited}}.dump(2).c_str());
      } else {
        std::printf("NVMe writes drained (pending 0) after %.2f s\n", waited);
      }
      return 0;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return Fail(socket_path, as_json,
                  Status(StatusCode::kDeadlineExceeded,
                         std::to_string(nvme->pending_writes) +
                             " NVMe writes still pending after " + std::to_string(waited) +
                             " s (flush --timeout): the writer is behind or the "
                             "tier is degraded (see kvtierctl health)"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace kvtier::ctl
