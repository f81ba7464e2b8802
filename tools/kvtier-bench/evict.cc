#include "evict.h"

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "bench_common.h"
#include "kvtier/tiers/slot_tier.h"

namespace kvtier::bench {
namespace {

constexpr uint64_t kSlotBytes = 4096;
const ChunkKey kRoot{0x6b76, 0x7469};  // the namespace id

struct Figures {
  double fill_ns = 0;   // per store into free space
  double store_ns = 0;  // per store that evicts
  double checks_per_eviction = 0;
};

// Stores chain `c` (keys c * length ... c * length + length - 1), one chunk per slot.
void StoreChain(SlotTier& tier, uint32_t ns, uint64_t c, uint64_t length) {
  for (uint64_t i = 0; i < length; ++i) {
    const uint64_t id = c * length + i;
    auto slot = tier.AllocateSlot(ns);
    if (!slot) Die("evict: no slot for chunk " + std::to_string(id));
    const ChunkKey parent = i == 0 ? kRoot : ChunkKey{id - 1, 1};
    if (tier.Insert(ChunkKey{id, 1}, parent, kRoot, ns, *slot) == ChunkIndex::kNone) {
      Die("evict: chunk " + std::to_string(id) + " was not inserted");
    }
  }
}

// A hit on chain `c`'s resident prefix, touched children first (CacheCore::GrantLookup).
void Hit(SlotTier& tier, uint64_t c, uint64_t length) {
  std::vector<uint32_t> hits;
  for (uint64_t i = 0; i < length; ++i) {
    const uint32_t h = tier.Find(ChunkKey{c * length + i, 1});
    if (h == ChunkIndex::kNone) break;
    hits.push_back(h);
  }
  for (auto it = hits.rbegin(); it != hits.rend(); ++it) tier.Touch(*it);
}

Figures Run(uint64_t chunks, uint64_t length, bool with_hits) {
  const uint64_t chains = chunks / length;  // the tier holds exactly these, full
  SlotTier tier(chains * length * kSlotBytes);
  const uint32_t ns = tier.AddNamespace(kSlotBytes);
  Figures f;
  auto t0 = Clock::now();
  for (uint64_t c = 0; c < chains; ++c) StoreChain(tier, ns, c, length);
  f.fill_ns = Seconds(Clock::now() - t0) * 1e9 / static_cast<double>(chains * length);
  std::mt19937_64 rng(7);
  t0 = Clock::now();
  for (uint64_t c = chains; c < 2 * chains; ++c) {
    // A prompt stored in the last `chains` stores: resident, or partly.
    if (with_hits) Hit(tier, c - 1 - rng() % std::min<uint64_t>(c, chains / 2 + 1), length);
    StoreChain(tier, ns, c, length);
  }
  f.store_ns = Seconds(Clock::now() - t0) * 1e9 / static_cast<double>(chains * length);
  const SlotTierCounters& n = tier.counters();
  if (n.evictions != chains * length) {
    Die("evict: " + std::to_string(n.evictions) + " evictions, expected " +
        std::to_string(chains * length));
  }
  f.checks_per_eviction = static_cast<double>(n.victim_checks) / static_cast<double>(n.evictions);
  return f;
}

}  // namespace

int RunEvict(uint64_t chunks, uint64_t chain_length) {
  if (chain_length == 0 || chunks < chain_length) Die("evict: --chunks below --chain-length");
  std::printf(
      "kvtier-bench evict: a tier of %llu slots full of %llu-chunk prefix chains, then "
      "as many chunks stored again (each evicts one)\n",
      static_cast<unsigned long long>(chunks / chain_length * chain_length),
      static_cast<unsigned long long>(chain_length));
  std::printf("  %-34s %12s %14s %8s %18s\n", "workload", "fill ns/chunk", "evict ns/chunk",
              "ratio", "checks/eviction");
  for (const bool with_hits : {false, true}) {
    std::vector<Figures> runs;
    for (int r = 0; r < 3; ++r) runs.push_back(Run(chunks, chain_length, with_hits));
    auto median = [&](double Figures::*field) {
      std::vector<double> v;
      for (const Figures& f : runs) v.push_back(f.*field);
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    const double fill = median(&Figures::fill_ns), store = median(&Figures::store_ns);
    std::printf("  %-34s %12.0f %14.0f %8.2f %18.2f\n",
                with_hits ? "fresh prompts, each after a hit" : "fresh prompts", fill, store,
                store / fill, median(&Figures::checks_per_eviction));
  }
  std::printf("  (medians of 3 runs; ratio: a store that evicts over one into free space)\n");
  return 0;
}

}  // namespace kvtier::bench
