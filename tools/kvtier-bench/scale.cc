#include "scale.h"

#include <atomic>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include "bench_common.h"
#include "kvtier/tools/percentiles.h"

namespace kvtier::bench {
namespace {

using tools::Percentile;

struct Phase {
  double lookups_per_s = 0;
  double p50_us = 0;
  double p99_us = 0;
};

// One session: its own client and prompt, stored once before the timing.
struct Session {
  std::unique_ptr<Client> client;
  NamespaceHandle ns;
  std::vector<int32_t> tokens;
  uint64_t chunks = 0;
};

Session OpenSession(const std::string& socket, bool control_ring, uint64_t seed,
                    uint64_t prompt_tokens) {
  Session s;
  s.client = ConnectOrDie(socket, control_ring);
  s.ns = Must(s.client->OpenNamespace(LookupSpec("bench-scale")), "open namespace");
  s.tokens = UniquePrompt(seed, prompt_tokens);
  s.chunks = StoreZerosOrDie(*s.client, s.ns, s.tokens);
  return s;
}

// `sessions` look up their prompts at once, back to back, for `seconds`.
Phase Run(std::vector<Session>& sessions, double seconds) {
  std::atomic<bool> go{false};
  std::vector<std::vector<double>> us(sessions.size());
  std::vector<std::thread> threads;
  const auto duration = std::chrono::duration<double>(seconds);
  for (size_t i = 0; i < sessions.size(); ++i) {
    threads.emplace_back([&, i] {
      while (!go.load()) std::this_thread::yield();
      Session& s = sessions[i];
      const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(duration);
      for (auto t0 = Clock::now(); t0 < until;) {
        auto r = Must(s.client->Lookup(s.ns, s.tokens), "lookup");
        const auto t1 = Clock::now();
        if (r.num_chunks != s.chunks)
          Die("lookup found " + std::to_string(r.num_chunks) + " chunks");
        us[i].push_back(Micros(t1 - t0));
        t0 = t1;
      }
    });
  }
  const auto start = Clock::now();
  go.store(true);
  for (auto& t : threads) t.join();
  const double elapsed = Seconds(Clock::now() - start);
  std::vector<double> all;
  for (auto& v : us) all.insert(all.end(), v.begin(), v.end());
  return {static_cast<double>(all.size()) / elapsed, Percentile(all, 50), Percentile(all, 99)};
}

}  // namespace

int RunScale(const std::string& socket, int clients, double seconds, uint64_t prompt_tokens) {
  std::printf(
      "kvtier-bench scale: %llu-token prompts in DRAM, Lookups back to back, %g s per phase, "
      "%u cores\n",
      static_cast<unsigned long long>(prompt_tokens), seconds, std::thread::hardware_concurrency());
  std::printf("%-14s %8s %12s %10s %10s %12s %10s\n", "path", "clients", "lookups/s", "p50 us",
              "p99 us", "x 1 client", "p99 / 1");
  auto admin = AdminStub(socket);
  for (const bool ring : {true, false}) {
    const uint64_t ring_before = Must(admin->Stats(), "stats").ring_lookups;
    std::vector<Session> sessions;
    for (int i = 0; i < clients; ++i) {
      sessions.push_back(OpenSession(
          socket, ring, 1000 + static_cast<uint64_t>(i) + (ring ? 0 : 500), prompt_tokens));
    }
    std::vector<Session> one;
    one.push_back(std::move(sessions.front()));
    const Phase alone = Run(one, seconds);
    sessions.front() = std::move(one.front());
    const Phase all = Run(sessions, seconds);
    // Counted daemon-wide: other clients' ring Lookups meanwhile add to it.
    const uint64_t ring_lookups = Must(admin->Stats(), "stats").ring_lookups - ring_before;
    const bool no_ring = ring && ring_lookups == 0;
    const char* path = !ring ? "gRPC" : no_ring ? "gRPC (no ring)" : "control ring";
    std::printf("%-14s %8d %12.0f %10.1f %10.1f %12s %10s\n", path, 1, alone.lookups_per_s,
                alone.p50_us, alone.p99_us, "-", "-");
    std::printf("%-14s %8d %12.0f %10.1f %10.1f %12.2f %10.2f\n", path, clients, all.lookups_per_s,
                all.p50_us, all.p99_us, all.lookups_per_s / alone.lookups_per_s,
                all.p99_us / alone.p99_us);
    if (no_ring) {
      std::printf(
          "  NOTE: no Lookup went over the control ring (KVTIER_CONTROL_RING off, or a "
          "prompt too long for a ring slot): the two rows above are gRPC figures\n");
    }
  }
  std::printf("(goal: >= 1.7x the single client's lookups/s, with p99 <= 2x its p99)\n");
  return 0;
}

}  // namespace kvtier::bench
