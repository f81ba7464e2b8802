#include "kvtier/tools/cache_reference.h"

#include <compare>
#include <limits>
#include <set>
#include <unordered_map>

#include "kvtier/tools/synthetic_kv.h"

namespace kvtier::tools {
namespace {

uint64_t Mix(uint64_t x) {  // SplitMix64's finalizer
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t Combine(uint64_t a, uint64_t b) { return Mix(a ^ Mix(b)); }

// A cached chunk's place in the victim order: the largest goes first.
struct Rank {
  uint64_t major = 0;  // LRU: how long ago it was used; Belady: its next use
  uint32_t depth = 0;  // its index in its prompt; the deeper goes first on a tie
  uint64_t key = 0;
  auto operator<=>(const Rank&) const = default;
};

// The rules of cache_reference.h with `rank(r, j)`: the rank chunk j of
// request r takes when request r uses it.
template <class RankFn>
CacheSimResult Simulate(std::span<const ChunkedRequest> requests, uint64_t capacity_chunks,
                        uint32_t chunk_tokens, RankFn rank) {
  CacheSimResult out;
  std::unordered_map<uint64_t, Rank> cached;
  std::set<Rank> order;
  for (size_t r = 0; r < requests.size(); ++r) {
    const std::vector<uint64_t>& keys = requests[r].keys;
    size_t hit = 0;
    while (hit < keys.size() && cached.contains(keys[hit])) ++hit;
    ++out.requests;
    out.prompt_tokens += requests[r].prompt_tokens;
    out.hit_tokens += uint64_t{hit} * chunk_tokens;
    for (size_t j = 0; j < keys.size(); ++j) {
      const Rank now = rank(r, j);
      auto it = cached.find(keys[j]);
      if (it != cached.end()) {  // a hit, or a chunk past the first miss that stayed
        order.erase(it->second);
        order.insert(now);
        it->second = now;
        continue;
      }
      if (capacity_chunks == 0) continue;
      cached.emplace(keys[j], now);
      order.insert(now);
      if (order.size() > capacity_chunks) {
        const Rank victim = *order.rbegin();
        order.erase(std::prev(order.end()));
        cached.erase(victim.key);
      }
    }
  }
  return out;
}

}  // namespace

std::vector<ChunkedRequest> ChunkTrace(std::span<const TraceRequest> trace, uint32_t chunk_tokens) {
  std::vector<ChunkedRequest> out;
  out.reserve(trace.size());
  std::vector<uint64_t> chain;
  for (const TraceRequest& req : trace) {
    chain.clear();
    uint64_t h = 0;
    for (uint64_t id : req.hash_ids) chain.push_back(h = Combine(h, id));
    ChunkedRequest c;
    c.prompt_tokens = req.input_length;
    const uint64_t n = chunk_tokens == 0 ? 0 : req.input_length / chunk_tokens;
    for (uint64_t j = 0; j < n; ++j) {
      const uint64_t end = (j + 1) * chunk_tokens;  // tokens up to the chunk's last
      c.keys.push_back(Combine(chain[(end - 1) / kTraceBlockTokens], end));
    }
    out.push_back(std::move(c));
  }
  return out;
}

CacheSimResult SimulateLru(std::span<const ChunkedRequest> requests, uint64_t capacity_chunks,
                           uint32_t chunk_tokens) {
  return Simulate(requests, capacity_chunks, chunk_tokens, [&](size_t r, size_t j) {
    return Rank{std::numeric_limits<uint64_t>::max() - r, static_cast<uint32_t>(j),
                requests[r].keys[j]};
  });
}

CacheSimResult SimulateBelady(std::span<const ChunkedRequest> requests, uint64_t capacity_chunks,
                              uint32_t chunk_tokens) {
  // next_use[r][j]: the next request after r that holds chunk j of request r.
  constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();
  std::vector<std::vector<uint64_t>> next_use(requests.size());
  std::unordered_map<uint64_t, uint64_t> seen;  // key -> the earliest request after r
  for (size_t r = requests.size(); r-- > 0;) {
    const std::vector<uint64_t>& keys = requests[r].keys;
    next_use[r].resize(keys.size());
    for (size_t j = 0; j < keys.size(); ++j) {
      auto it = seen.find(keys[j]);
      next_use[r][j] = it == seen.end() ? kNever : it->second;
    }
    for (uint64_t k : keys) seen[k] = r;
  }
  return Simulate(requests, capacity_chunks, chunk_tokens, [&](size_t r, size_t j) {
    return Rank{next_use[r][j], static_cast<uint32_t>(j), requests[r].keys[j]};
  });
}

}  // namespace kvtier::tools
