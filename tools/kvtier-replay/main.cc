// kvtier-replay: drives kvtierd with a real trace through the client SDK, with
// real bytes, and reports token hit rate, bytes moved, latencies and verify
// errors. Closed loop: one request at a time, in trace order.
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
#include <optional>
#include <random>
#include <thread>
#include <utility>
#include <nlohmann/json.hpp>

#include "kvtier/logging.h"
#include "kvtier/admin_client.h"
#include "kvtier/client.h"
#include "kvtier/socket_path.h"
#include "kvtier/tools/cli_words.h"
#include "kvtier/tools/model_presets.h"
#include "kvtier/tools/percentiles.h"
#include "kvtier/tools/synthetic_kv.h"
#include "kvtier/tools/trace.h"

namespace {

using kvtier::tools::Percentile;
using Clock = std::chrono::steady_clock;

struct Totals {
  uint64_t requests = 0, prompt_tokens = 0, hit_tokens = 0, bytes_loaded = 0, bytes_stored = 0;
  uint64_t chunks_loaded = 0, chunks_stored = 0, chunks_dropped = 0, verify_errors = 0;
  uint64_t fail_open = 0;
  uint64_t nvme_hit_tokens = 0, nvme_bytes_loaded = 0;
  uint64_t prefetch_nvme_chunks = 0;   // NVMe chunks the prefetches set out to promote
  uint64_t prefetch_ready_chunks = 0;  // of those, ready in DRAM when the load came
  std::vector<double> lookup_us, load_us, store_us;
};

double Us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

}  // namespace

int main(int argc, char** argv) {
  kvtier::LogToStderr("kvtier-replay");  // results go to stdout; logs, the SDK's too, to stderr
  std::string socket_path, trace_path, model = "tiny", json_path;
  uint32_t chunk_tokens = 256;
  uint64_t limit = 0, generate = 0;
  int64_t deadline_ms = 100;
  bool quiet = false;
  std::string prefetch = "off";
  int64_t schedule_delay_ms = 0;
  CLI::App app{"kvtier-replay: replay a Mooncake-format trace through kvtierd with real bytes",
               "kvtier-replay"};
  app.add_option("--socket", socket_path, "kvtierd socket (default: the daemon's default)");
  auto* trace_opt = app.add_option("--trace", trace_path, "Mooncake JSONL trace")
                        ->check(CLI::ExistingFile);
  auto* generate_opt =
      app.add_option("--generate", generate,
                     "instead of --trace: N requests (1 to 1,000,000) of the built-in multi-turn "
                     "generator")
          ->check(kvtier::tools::kCount)
          ->check(CLI::Range(uint64_t{1}, uint64_t{1'000'000}))  // all are generated up front
          ->excludes(trace_opt);
  app.add_option("--model", model, "tiny | qwen2.5-0.5b | llama3-8b")->capture_default_str();
  app.add_option("--chunk-tokens", chunk_tokens, "tokens per chunk")->capture_default_str();
  app.add_option("--limit", limit, "with --trace: replay the first N requests (0 = all)")
      ->check(kvtier::tools::kCount)
      ->excludes(generate_opt);  // --generate N already says how many
  app.add_option("--json", json_path, "write the summary as JSON here ('-': JSON alone on stdout, the table on stderr)");
  app.add_option("--deadline-ms", deadline_ms, "client deadline per RPC")
      ->check(CLI::Range(int64_t{1}, int64_t{600000}))
      ->capture_default_str();
  app.add_option("--prefetch", prefetch,
                 "prefetch on arrival with this policy: off, best_effort, wait_complete, timeout")
      ->check(CLI::IsMember({"off", "best_effort", "wait_complete", "timeout"}))
      ->capture_default_str();
  app.add_option("--schedule-delay-ms", schedule_delay_ms,
                 "time from a request's arrival (and prefetch) to its load")
      ->check(CLI::Range(int64_t{0}, int64_t{60000}))
      ->capture_default_str();
  app.add_flag("--quiet", quiet, "no progress line");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help exits 0; usage errors exit 2
  }

  if (trace_path.empty() && generate == 0) {
    std::fprintf(stderr, "kvtier-replay: give --trace FILE or --generate N\n");
    return 2;
  }
  if (!json_path.empty() && json_path != "-") {  // before the run, not after it
    const std::filesystem::path dir = std::filesystem::path(json_path).parent_path();
    const std::string d = dir.empty() ? "." : dir.string();
    std::error_code ec;
    if (std::filesystem::is_directory(json_path, ec)) {
      std::fprintf(stderr, "kvtier-replay: --json %s is a folder; give a file path\n",
                   json_path.c_str());
      return 2;
    }
    if (access(d.c_str(), W_OK) != 0) {
      std::fprintf(stderr, "kvtier-replay: --json %s: cannot write into %s: %s\n",
                   json_path.c_str(), d.c_str(), std::strerror(errno));
      return 2;
    }
  }
  auto spec = kvtier::tools::ModelPreset(model, chunk_tokens);
  if (!spec.ok()) {
    std::fprintf(stderr, "kvtier-replay: %s\n", spec.status().message().c_str());
    return 2;
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

  kvtier::ClientOptions copts;
  copts.socket_path = socket_path;
  copts.deadline = std::chrono::milliseconds(deadline_ms);
  copts.client_name = "kvtier-replay";
  auto client_or = kvtier::Client::Connect(copts);
  const std::string where = socket_path.empty() ? kvtier::DefaultSocketPath() : socket_path;
  if (!client_or.ok()) {  // a path that is no socket, say: unreachable, as for kvtierctl
    std::fprintf(stderr, "kvtier-replay: %s\n", client_or.status().message().c_str());
    return 1;
  }
  auto client = std::move(client_or).value();
  if (!client->connected()) {
    std::fprintf(stderr, "kvtier-replay: kvtierd is not reachable at %s\n", where.c_str());
    return 1;
  }
  auto ns_or = client->OpenNamespace(*spec);
  if (!ns_or.ok()) {
    std::fprintf(stderr, "kvtier-replay: %s\n", ns_or.status().message().c_str());
    return 2;
  }
  const kvtier::NamespaceHandle ns = *ns_or;
  kvtier::PrefetchOptions popts;
  popts.policy = prefetch == "wait_complete" ? kvtier::PrefetchPolicy::kWaitComplete
                 : prefetch == "timeout"     ? kvtier::PrefetchPolicy::kTimeout
                                             : kvtier::PrefetchPolicy::kBestEffort;
  // NVMe bytes moved during the replay, from the daemon's counters: unknown
  // (nullopt) when either Stats call fails, e.g. a daemon that stopped meanwhile.
  auto admin = kvtier::AdminClient::Connect(
      where,
      std::max<std::chrono::milliseconds>(copts.deadline, std::chrono::seconds(1)));
  using Counters = std::optional<std::pair<uint64_t, uint64_t>>;
  const auto nvme_counters = [&]() -> Counters {
    if (!admin.ok()) return std::nullopt;
    auto s = (*admin)->Stats();
    if (!s.ok()) return std::nullopt;
    for (const auto& tier : s->tiers) {
      if (tier.name == "nvme") return std::pair{tier.read_bytes, tier.write_bytes};
    }
    return std::pair<uint64_t, uint64_t>{0, 0};  // DRAM only: no NVMe bytes
  };
  const Counters nvme_before = nvme_counters();
  const uint64_t pb = ns.layout.payload_bytes;
  const uint32_t layers = spec->num_layers;

  Totals t;
  // Request ids unique to this run: several replays may share a daemon.
  const std::string run_id = "replay-" + std::to_string(getpid()) + "-" +
                             std::to_string(std::random_device{}()) + "-";
  std::vector<uint64_t> chunk_errors;
  const auto start = Clock::now();
  auto last_progress = start;
  const bool show_progress = !quiet && isatty(STDERR_FILENO);
  for (const auto& req : trace) {
    const std::vector<int32_t> tokens = kvtier::tools::SynthesizePrompt(req.hash_ids, req.input_length);
    // One engine request: the daemon counts its Prefetch and Load once.
    const std::string request_id = run_id + std::to_string(t.requests);
    const std::vector<kvtier::ChunkKey> keys = kvtier::Client::ChunkKeys(ns, tokens);
    // Verify in place, inside the lease (no staging buffer: a llama3-8b prompt
    // of the trace holds up to 15 GiB of KV). The verification time is taken
    // out of the load latency; only chunks Load reports valid are counted.
    chunk_errors.assign(keys.size(), 0);
    kvtier::PrefetchTicket ticket;
    if (prefetch != "off") {
      auto issued = client->Prefetch(ns, tokens, popts, request_id);
      if (!issued.ok()) {
        std::fprintf(stderr, "\nkvtier-replay: prefetch: %s\n", issued.status().ToString().c_str());
        return 1;
      }
      ticket = *issued;
      if (!ticket.fail_open.ok()) ++t.fail_open;
      t.prefetch_nvme_chunks += ticket.nvme_chunks;
    }
    if (schedule_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(schedule_delay_ms));
    Clock::duration verify_time{};
    const auto l0 = Clock::now();
    auto load = client->Load(ns, tokens, [&](size_t i, std::span<const std::byte> payload) {
      const auto v0 = Clock::now();
      chunk_errors[i] = kvtier::tools::CountPayloadErrors(keys[i], layers, payload);
      verify_time += Clock::now() - v0;
      return kvtier::Status::Ok();
    }, SIZE_MAX, prefetch != "off" ? &ticket : nullptr, request_id);
    const auto l1 = Clock::now();
    if (!load.ok()) {
      std::fprintf(stderr, "\nkvtier-replay: load: %s\n", load.status().ToString().c_str());
      return 1;
    }
    if (!load->fail_open.ok()) ++t.fail_open;
    t.load_us.push_back(Us(l1 - l0 - verify_time));
    t.lookup_us.push_back(static_cast<double>(load->lookup_time.count()));
    // Only the verified leading run counts: the engine would use nothing past
    // a wrong chunk. Chunks from NVMe, promoted by the load or by its prefetch
    // ticket (kvtierd counts both as NVMe hits; a load has one or the other),
    // are the trailing ones of the load.
    uint32_t verified = 0;
    while (verified < load->num_chunks && chunk_errors[verified] == 0) ++verified;
    for (uint32_t i = 0; i < load->num_chunks; ++i) {
      if (chunk_errors[i] != 0) ++t.verify_errors;
    }
    const uint32_t dram_chunks = load->num_chunks - load->nvme_chunks - load->prefetched_chunks;
    const uint32_t nvme_verified = verified > dram_chunks ? verified - dram_chunks : 0;
    t.hit_tokens += uint64_t{verified} * chunk_tokens;
    t.nvme_hit_tokens += uint64_t{nvme_verified} * chunk_tokens;
    t.nvme_bytes_loaded += uint64_t{nvme_verified} * pb;
    t.prefetch_ready_chunks += std::min(verified, load->prefetched_chunks);
    t.chunks_loaded += verified;
    t.bytes_loaded += uint64_t{verified} * pb;

    if (verified < keys.size()) {
      const auto s0 = Clock::now();
      auto store = client->Store(
          ns, tokens,
          [&](size_t i, std::span<std::byte> payload) {
            kvtier::tools::FillPayload(keys[i], layers, payload);
            return kvtier::Status::Ok();
          },
          verified);
      t.store_us.push_back(Us(Clock::now() - s0));
      if (!store.ok()) {
        std::fprintf(stderr, "\nkvtier-replay: store: %s\n", store.status().ToString().c_str());
        return 1;
      }
      if (!store->fail_open.ok()) ++t.fail_open;
      t.chunks_stored += store->stored_chunks;
      t.chunks_dropped += store->dropped_chunks;
      t.bytes_stored += store->stored_bytes;
    }
    ++t.requests;
    t.prompt_tokens += req.input_length;
    if (show_progress && Clock::now() - last_progress > std::chrono::milliseconds(500)) {
      last_progress = Clock::now();
      std::fprintf(stderr, "\r[%llu/%zu] token hit rate %.4f, verify errors %llu   ",
                   static_cast<unsigned long long>(t.requests), trace.size(),
                   t.prompt_tokens ? static_cast<double>(t.hit_tokens) / t.prompt_tokens : 0.0,
                   static_cast<unsigned long long>(t.verify_errors));
    }
  }
  const double wall_s = std::chrono::duration<double>(Clock::now() - start).count();
  if (show_progress) std::fprintf(stderr, "\n");

  const Counters nvme_after = nvme_counters();
  nlohmann::json nvme_read, nvme_written;  // null when unknown
  if (nvme_before && nvme_after && nvme_after->first >= nvme_before->first &&
      nvme_after->second >= nvme_before->second) {  // a daemon restart would reset them
    nvme_read = nvme_after->first - nvme_before->first;
    nvme_written = nvme_after->second - nvme_before->second;
  }
  const double hit_rate = t.prompt_tokens ? static_cast<double>(t.hit_tokens) / t.prompt_tokens : 0;
  nlohmann::json j = {
      {"trace", trace_path.empty() ? "built-in multi-turn generator" : trace_path},
      {"model", model},
      {"chunk_tokens", chunk_tokens},
      {"requests", t.requests},
      {"prompt_tokens", t.prompt_tokens},
      {"hit_tokens", t.hit_tokens},
      {"token_hit_rate", hit_rate},
      {"tiers",
       {{"dram",
         {{"hit_tokens", t.hit_tokens - t.nvme_hit_tokens},
          {"bytes_loaded", t.bytes_loaded - t.nvme_bytes_loaded}}},
        {"nvme", {{"hit_tokens", t.nvme_hit_tokens}, {"bytes_loaded", t.nvme_bytes_loaded}}}}},
      {"prefetch", {{"policy", prefetch},
                    {"schedule_delay_ms", schedule_delay_ms},
                    {"nvme_chunks_requested", t.prefetch_nvme_chunks},
                    {"ready_in_time_chunks", t.prefetch_ready_chunks}}},
      {"nvme_bytes_read", nvme_read},
      {"nvme_bytes_written", nvme_written},
      {"chunks_loaded", t.chunks_loaded},
      {"chunks_stored", t.chunks_stored},
      {"chunks_dropped", t.chunks_dropped},
      {"bytes_loaded", t.bytes_loaded},
      {"bytes_stored", t.bytes_stored},
      {"verify_errors", t.verify_errors},
      {"fail_open", t.fail_open},
      {"lookup_latency_us", {{"p50", Percentile(t.lookup_us, 50)}, {"p99", Percentile(t.lookup_us, 99)}}},
      {"load_latency_us", {{"p50", Percentile(t.load_us, 50)}, {"p99", Percentile(t.load_us, 99)}}},
      {"store_latency_us", {{"p50", Percentile(t.store_us, 50)}, {"p99", Percentile(t.store_us, 99)}}},
      {"wall_s", wall_s},
  };
  FILE* const table = json_path == "-" ? stderr : stdout;  // `--json -`: JSON alone on stdout
  std::fprintf(table, "kvtier-replay summary (%s, model %s, chunk %u tokens)\n",
              j["trace"].get<std::string>().c_str(), model.c_str(), chunk_tokens);
  std::fprintf(table, "  %-22s %llu\n", "requests", static_cast<unsigned long long>(t.requests));
  std::fprintf(table, "  %-22s %llu\n", "prompt tokens", static_cast<unsigned long long>(t.prompt_tokens));
  std::fprintf(table, "  %-22s %llu\n", "hit tokens (dram)",
              static_cast<unsigned long long>(t.hit_tokens - t.nvme_hit_tokens));
  std::fprintf(table, "  %-22s %llu\n", "hit tokens (nvme)", static_cast<unsigned long long>(t.nvme_hit_tokens));
  std::fprintf(table, "  %-22s %.4f\n", "token hit rate", hit_rate);
  if (prefetch != "off") {
    std::fprintf(table, "  %-22s %llu of %llu NVMe chunks (%s, schedule delay %lld ms)\n",
                "prefetched in time", static_cast<unsigned long long>(t.prefetch_ready_chunks),
                static_cast<unsigned long long>(t.prefetch_nvme_chunks), prefetch.c_str(),
                static_cast<long long>(schedule_delay_ms));
  }
  if (nvme_read.is_null()) {
    std::fprintf(table, "  %-22s unknown (the daemon's Stats failed or it restarted)\n", "nvme bytes");
  } else {
    std::fprintf(table, "  %-22s %.1f MiB read, %.1f MiB written\n", "nvme bytes",
                nvme_read.get<uint64_t>() / 1048576.0, nvme_written.get<uint64_t>() / 1048576.0);
  }
  std::fprintf(table, "  %-22s %.1f MiB\n", "bytes loaded", t.bytes_loaded / 1048576.0);
  std::fprintf(table, "  %-22s %.1f MiB\n", "bytes stored", t.bytes_stored / 1048576.0);
  std::fprintf(table, "  %-22s %llu\n", "chunks dropped", static_cast<unsigned long long>(t.chunks_dropped));
  std::fprintf(table, "  %-22s %llu\n", "verify errors", static_cast<unsigned long long>(t.verify_errors));
  std::fprintf(table, "  %-22s %llu\n", "fail-open calls", static_cast<unsigned long long>(t.fail_open));
  std::fprintf(table, "  %-22s p50 %.0f us, p99 %.0f us\n", "lookup latency", Percentile(t.lookup_us, 50),
              Percentile(t.lookup_us, 99));
  std::fprintf(table, "  %-22s p50 %.0f us, p99 %.0f us\n", "load latency", Percentile(t.load_us, 50),
              Percentile(t.load_us, 99));
  std::fprintf(table, "  %-22s p50 %.0f us, p99 %.0f us\n", "store latency", Percentile(t.store_us, 50),
              Percentile(t.store_us, 99));
  std::fprintf(table, "  %-22s %.1f s\n", "wall", wall_s);
  if (json_path == "-") {
    std::printf("%s\n", j.dump(2).c_str());
  } else if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << j.dump(2) << "\n";
    if (!out) {
      std::fprintf(stderr, "kvtier-replay: cannot write %s\n", json_path.c_str());
      return 1;
    }
  }
  return t.verify_errors == 0 ? 0 : 3;
}
