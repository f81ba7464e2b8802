// Offline references for a replay's token hit rate: a cache of C chunks under
// LRU and under Belady's OPT, run over a trace's requests as kvtier-replay
// sends them (one at a time, in trace order).
//
// Rules (the same for both policies), mirroring kvtier-replay:
// - A request is its sequence of full chunks (a partial last chunk is never
//   stored, so it is never a hit); equal keys mean equal prefixes.
// - Its hit is a prefix match: the tokens of its leading chunks present in the
//   cache, stopping at the first miss (chunk_tokens each).
// - Then every chunk from the first miss on is stored (kvtier-replay stores
//   them all, some may be present already), in prompt order. Each insert into
//   a full cache first adds the chunk and then evicts the policy's victim,
//   which may be the chunk just added (it is not kept: the store drops it).
// - LRU: a chunk's recency is the last request that held it; among chunks of
//   one request the deeper goes first. Every request holding a chunk holds its
//   whole prefix, so a parent is never older than its child: this is the
//   daemon's leaf-first LRU (no chunk leaves while a descendant stays).
// - Belady (OPT): the victim is the chunk whose next request is farthest off
//   (never again = infinitely far); ties go to the deeper chunk. A parent's
//   next use is never later than its child's, so OPT too keeps every cached
//   chunk's prefix, and its chunk hits are its prefix hits. With the victim
//   allowed to be the incoming chunk (bypass), this is Belady's MIN over the
//   chunk access stream, an upper bound on the full-chunk hits of any policy
//   with C chunks on this request order.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kvtier/tools/trace.h"

namespace kvtier::tools {

// One request as a cache sees it: its full chunks' keys in prompt order, and
// its prompt length (the denominator of the hit rate).
struct ChunkedRequest {
  std::vector<uint64_t> keys;
  uint64_t prompt_tokens = 0;
};

// The trace's requests cut into chunks of `chunk_tokens` (> 0) as
// kvtier-replay cuts them: chunk j covers tokens [j*ct, (j+1)*ct), present
// when (j+1)*ct <= input_length; its key names the block ids up to its last
// token and where it ends, so equal keys mean equal tokens.
std::vector<ChunkedRequest> ChunkTrace(std::span<const TraceRequest> trace, uint32_t chunk_tokens);

struct CacheSimResult {
  uint64_t requests = 0;
  uint64_t prompt_tokens = 0;
  uint64_t hit_tokens = 0;
  double TokenHitRate() const {
    return prompt_tokens == 0 ? 0.0 : static_cast<double>(hit_tokens) / prompt_tokens;
  }
};

// The cache of `capacity_chunks` chunks under each policy (rules above).
// `chunk_tokens` is the tokens a hit chunk counts for.
CacheSimResult SimulateLru(std::span<const ChunkedRequest> requests, uint64_t capacity_chunks,
                           uint32_t chunk_tokens);
CacheSimResult SimulateBelady(std::span<const ChunkedRequest> requests, uint64_t capacity_chunks,
                              uint32_t chunk_tokens);

}  // namespace kvtier::tools
