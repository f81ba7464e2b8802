#include "summary.h"

#include <fstream>

#include "kvtier/tools/percentiles.h"

namespace kvtier::replay {

using tools::Percentile;

nlohmann::json SummaryJson(const Totals& t, const RunInfo& info) {
  nlohmann::json mode = {{"kind", "closed_loop"}};
  if (info.clients > 0) {
    mode = {{"kind", "trace_times"},
            {"clients", info.clients},
            {"speedup", info.speedup},
            {"start_lag_us",
             {{"p50", Percentile(t.start_lag_us, 50)}, {"p99", Percentile(t.start_lag_us, 99)}}}};
  }
  return {
      {"mode", mode},
      {"trace", info.trace},
      {"model", info.model},
      {"chunk_tokens", info.chunk_tokens},
      {"requests", t.requests},
      {"prompt_tokens", t.prompt_tokens},
      {"hit_tokens", t.hit_tokens},
      {"token_hit_rate", t.HitRate()},
      {"tiers",
       {{"dram",
         {{"hit_tokens", t.hit_tokens - t.nvme_hit_tokens - t.remote_hit_tokens},
          {"bytes_loaded", t.bytes_loaded - t.nvme_bytes_loaded - t.remote_bytes_loaded}}},
        {"nvme", {{"hit_tokens", t.nvme_hit_tokens}, {"bytes_loaded", t.nvme_bytes_loaded}}},
        {"remote",
         {{"hit_tokens", t.remote_hit_tokens}, {"bytes_loaded", t.remote_bytes_loaded}}}}},
      {"prefetch",
       {{"policy", info.prefetch},
        {"schedule_delay_ms", info.schedule_delay_ms},
        {"nvme_chunks_requested", t.prefetch_nvme_chunks},
        {"ready_in_time_chunks", t.prefetch_ready_chunks}}},
      {"nvme_bytes_read", info.nvme_bytes_read},
      {"nvme_bytes_written", info.nvme_bytes_written},
      {"chunks_loaded", t.chunks_loaded},
      {"chunks_stored", t.chunks_stored},
      {"chunks_dropped", t.chunks_dropped},
      {"bytes_loaded", t.bytes_loaded},
      {"bytes_stored", t.bytes_stored},
      {"verify_errors", t.verify_errors},
      {"fail_open", t.fail_open},
      {"lookup_latency_us",
       {{"p50", Percentile(t.lookup_us, 50)}, {"p99", Percentile(t.lookup_us, 99)}}},
      {"load_latency_us", {{"p50", Percentile(t.load_us, 50)}, {"p99", Percentile(t.load_us, 99)}}},
      {"store_latency_us",
       {{"p50", Percentile(t.store_us, 50)}, {"p99", Percentile(t.store_us, 99)}}},
      {"wall_s", info.wall_s},
  };
}

void PrintSummary(FILE* table, const Totals& t, const RunInfo& info) {
  const auto u = [](uint64_t v) { return static_cast<unsigned long long>(v); };
  std::fprintf(table, "kvtier-replay summary (%s, model %s, chunk %u tokens)\n", info.trace.c_str(),
               info.model.c_str(), info.chunk_tokens);
  std::fprintf(table, "  %-22s %llu\n", "requests", u(t.requests));
  std::fprintf(table, "  %-22s %llu\n", "prompt tokens", u(t.prompt_tokens));
  std::fprintf(table, "  %-22s %llu\n", "hit tokens (dram)",
               u(t.hit_tokens - t.nvme_hit_tokens - t.remote_hit_tokens));
  std::fprintf(table, "  %-22s %llu\n", "hit tokens (nvme)", u(t.nvme_hit_tokens));
  if (t.remote_hit_tokens > 0) {
    std::fprintf(table, "  %-22s %llu\n", "hit tokens (remote)", u(t.remote_hit_tokens));
  }
  std::fprintf(table, "  %-22s %.4f\n", "token hit rate", t.HitRate());
  if (info.prefetch != "off") {
    std::fprintf(table, "  %-22s %llu of %llu NVMe chunks (%s, schedule delay %lld ms)\n",
                 "prefetched in time", u(t.prefetch_ready_chunks), u(t.prefetch_nvme_chunks),
                 info.prefetch.c_str(), static_cast<long long>(info.schedule_delay_ms));
  }
  if (info.nvme_bytes_read.is_null()) {
    std::fprintf(table, "  %-22s unknown (the daemon's Stats failed or it restarted)\n",
                 "nvme bytes");
  } else {
    std::fprintf(table, "  %-22s %.1f MiB read, %.1f MiB written\n", "nvme bytes",
                 info.nvme_bytes_read.get<uint64_t>() / 1048576.0,
                 info.nvme_bytes_written.get<uint64_t>() / 1048576.0);
  }
  std::fprintf(table, "  %-22s %.1f MiB\n", "bytes loaded", t.bytes_loaded / 1048576.0);
  std::fprintf(table, "  %-22s %.1f MiB\n", "bytes stored", t.bytes_stored / 1048576.0);
  std::fprintf(table, "  %-22s %llu\n", "chunks dropped", u(t.chunks_dropped));
  std::fprintf(table, "  %-22s %llu\n", "verify errors", u(t.verify_errors));
  std::fprintf(table, "  %-22s %llu\n", "fail-open calls", u(t.fail_open));
  std::fprintf(table, "  %-22s p50 %.0f us, p99 %.0f us\n", "lookup latency",
               Percentile(t.lookup_us, 50), Percentile(t.lookup_us, 99));
  std::fprintf(table, "  %-22s p50 %.0f us, p99 %.0f us\n", "load latency",
               Percentile(t.load_us, 50), Percentile(t.load_us, 99));
  std::fprintf(table, "  %-22s p50 %.0f us, p99 %.0f us\n", "store latency",
               Percentile(t.store_us, 50), Percentile(t.store_us, 99));
  if (info.clients > 0) {
    std::fprintf(table, "  %-22s %u clients, speedup %g, start lag p50 %.0f us, p99 %.0f us\n",
                 "at trace times", info.clients, info.speedup, Percentile(t.start_lag_us, 50),
                 Percentile(t.start_lag_us, 99));
  }
  std::fprintf(table, "  %-22s %.1f s\n", "wall", info.wall_s);
}

int WriteJson(const std::string& path, const nlohmann::json& j) {
  if (path == "-") {
    std::printf("%s\n", j.dump(2).c_str());
  } else if (!path.empty()) {
    std::ofstream out(path);
    out << j.dump(2) << "\n";
    if (!out) {
      std::fprintf(stderr, "kvtier-replay: cannot write %s\n", path.c_str());
      return 1;
    }
  }
  return 0;
}

NvmeBytes NvmeCounters(AdminClient* admin) {
  if (admin == nullptr) return std::nullopt;
  auto s = admin->Stats();
  if (!s.ok()) return std::nullopt;
  for (const auto& tier : s->tiers) {
    if (tier.name == "nvme") return std::pair{tier.read_bytes, tier.write_bytes};
  }
  return std::pair<uint64_t, uint64_t>{0, 0};  // DRAM only: no NVMe bytes
}

void SetNvmeBytes(const NvmeBytes& before, const NvmeBytes& after, RunInfo& info) {
  if (before && after && after->first >= before->first && after->second >= before->second) {
    info.nvme_bytes_read = after->first - before->first;
    info.nvme_bytes_written = after->second - before->second;
  }
}

}  // namespace kvtier::replay
