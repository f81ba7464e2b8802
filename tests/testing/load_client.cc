// kvtier_test_client load: the clients of the load test
// (tests/integration/load_test.cc). Threads, each with its own Client and so
// its own session, over several namespaces of different slot sizes.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "kvtier/tools/model_presets.h"
#include "testing/test_client_modes.h"

namespace kvtier::testclient {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// Namespaces of four slot sizes (model, chunk tokens).
constexpr std::array<std::pair<const char*, uint32_t>, 4> kSpecs = {
    {{"tiny", 32}, {"tiny", 64}, {"tiny", 128}, {"qwen2.5-0.5b", 16}}};

enum Kind { kLookup, kLoad, kStore, kPrefetch, kNumKinds };
constexpr std::array<const char*, kNumKinds> kKindNames = {"lookup", "load", "store", "prefetch"};

struct Tally {
  std::array<std::vector<uint32_t>, kNumKinds> latency_us;
  std::array<uint64_t, kNumKinds> fail_open{};
  uint64_t api_errors = 0;
  uint64_t loaded_chunks = 0;
  uint64_t stored_chunks = 0;
  uint64_t dropped_chunks = 0;
  PayloadCheck check;

  void Merge(const Tally& t) {
    for (int k = 0; k < kNumKinds; ++k) {
      latency_us[k].insert(latency_us[k].end(), t.latency_us[k].begin(), t.latency_us[k].end());
      fail_open[k] += t.fail_open[k];
    }
    api_errors += t.api_errors;
    loaded_chunks += t.loaded_chunks;
    stored_chunks += t.stored_chunks;
    dropped_chunks += t.dropped_chunks;
    check.checked_chunks += t.check.checked_chunks;
    check.bad_chunks += t.check.bad_chunks;
    check.wrong_bytes += t.check.wrong_bytes;
  }
};

// One client thread until `until`. Adds what it saw to *tally.
void RunClient(const Common& c, const LoadOptions& o, uint32_t index, Clock::time_point until,
               Tally* tally) {
  const auto& [model, chunk_tokens] = kSpecs[index % o.namespaces];
  Common mine = c;
  mine.model = model;
  mine.chunk_tokens = chunk_tokens;
  auto spec = tools::ModelPreset(model, chunk_tokens);
  auto client = ConnectOrFail(mine, "kvtier_test_client load");
  auto ns =
      client.ok() ? (*client)->OpenNamespace(*spec) : Result<NamespaceHandle>(client.status());
  if (!ns.ok()) {
    std::fprintf(stderr, "kvtier_test_client: client %u: %s\n", index,
                 ns.status().ToString().c_str());
    ++tally->api_errors;
    return;
  }
  const uint64_t pb = ns->layout.payload_bytes;
  tally->check.num_layers = spec->num_layers;
  tally->check.payload_bytes = pb;
  std::vector<std::byte> buffer(Conversations::kMaxChunks * pb);
  uint64_t rng = Mix(o.seed * 1000 + index);
  auto timed = [&](Kind kind, auto&& call) {
    const auto start = Clock::now();
    auto result = call();
    tally->latency_us[kind].push_back(static_cast<uint32_t>(
        std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start).count()));
    if (!result.ok()) {
      ++tally->api_errors;
      std::fprintf(stderr, "kvtier_test_client: %s: %s\n", kKindNames[kind],
                   result.status().ToString().c_str());
    } else if (!result->fail_open.ok()) {
      ++tally->fail_open[kind];
      std::fprintf(stderr, "kvtier_test_client: %s failed open: %s\n", kKindNames[kind],
                   result->fail_open.ToString().c_str());
    }
    return result;
  };
  while (Clock::now() < until) {
    rng = Mix(rng);
    const uint64_t conv = rng % o.conversations;
    const uint32_t turn = 1 + static_cast<uint32_t>((rng >> 20) % Conversations::kTurns);
    const std::vector<int32_t> tokens = Conversations::Prompt(conv, turn, chunk_tokens);
    const std::vector<ChunkKey> keys = Client::ChunkKeys(*ns, tokens);
    const uint64_t what = (rng >> 40) % 8;
    if (what < 2) {
      (void)timed(kLookup, [&] { return (*client)->Lookup(*ns, tokens); });
      continue;
    }
    std::optional<PrefetchTicket> ticket;
    if (what == 2) {
      auto t = timed(kPrefetch, [&] { return (*client)->Prefetch(*ns, tokens); });
      if (t.ok() && t->fail_open.ok()) ticket = *t;
    }
    auto load = timed(kLoad, [&] {
      return (*client)->Load(*ns, tokens, std::span(buffer).first(keys.size() * pb),
                             ticket ? &*ticket : nullptr);
    });
    if (!load.ok()) continue;
    tally->check.Check(keys, buffer, load->num_chunks);
    tally->loaded_chunks += load->num_chunks;
    if (load->num_chunks == keys.size()) continue;
    auto store = timed(kStore, [&] {
      return (*client)->Store(*ns, tokens, PatternWriter(keys, spec->num_layers), load->num_chunks);
    });
    if (store.ok()) {
      tally->stored_chunks += store->stored_chunks;
      tally->dropped_chunks += store->dropped_chunks;
    }
  }
}

json Percentiles(std::vector<uint32_t>& us, double seconds) {
  if (us.empty()) return {{"calls", 0}};
  std::sort(us.begin(), us.end());
  auto at = [&](double q) {
    return us[std::min(us.size() - 1, static_cast<size_t>(q * us.size()))];
  };
  return {{"calls", us.size()},
          {"per_s", static_cast<double>(us.size()) / seconds},
          {"p50_us", at(0.50)},
          {"p99_us", at(0.99)},
          {"max_us", us.back()}};
}

}  // namespace

int LoadRun(const Common& c, const LoadOptions& o) {
  if (o.clients == 0 || o.namespaces == 0 || o.namespaces > kSpecs.size() || o.conversations == 0 ||
      o.seconds <= 0) {
    std::fprintf(stderr, "kvtier_test_client: load: bad options\n");
    return 2;
  }
  const auto start = Clock::now();
  const auto until =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.seconds));
  std::vector<Tally> tallies(o.clients);
  std::vector<std::thread> threads;
  for (uint32_t i = 0; i < o.clients; ++i) {
    threads.emplace_back(RunClient, std::cref(c), std::cref(o), i, until, &tallies[i]);
  }
  for (auto& t : threads) t.join();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  Tally all;
  for (const Tally& t : tallies) all.Merge(t);
  json calls = json::object();
  uint64_t total = 0, fail_open = 0;
  for (int k = 0; k < kNumKinds; ++k) {
    total += all.latency_us[k].size();
    fail_open += all.fail_open[k];
    calls[kKindNames[k]] = Percentiles(all.latency_us[k], seconds);
    calls[kKindNames[k]]["fail_open"] = all.fail_open[k];
  }
  const json result = {{"seconds", seconds},
                       {"clients", o.clients},
                       {"namespaces", o.namespaces},
                       {"calls", total},
                       {"calls_per_s", static_cast<double>(total) / seconds},
                       {"per_call", calls},
                       {"api_errors", all.api_errors},
                       {"fail_open", fail_open},
                       {"loaded_chunks", all.loaded_chunks},
                       {"stored_chunks", all.stored_chunks},
                       {"dropped_chunks", all.dropped_chunks},
                       {"checked_chunks", all.check.checked_chunks},
                       {"bad_chunks", all.check.bad_chunks},
                       {"wrong_bytes", all.check.wrong_bytes}};
  std::printf("RESULT %s\n", result.dump().c_str());
  std::fflush(stdout);
  if (all.check.bad_chunks != 0) return 3;
  return all.api_errors == 0 ? 0 : 1;
}

}  // namespace kvtier::testclient
