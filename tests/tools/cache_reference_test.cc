#include "kvtier/tools/cache_reference.h"

#include <gtest/gtest.h>

#include <random>

namespace kvtier::tools {
namespace {

// Requests given straight as chunk keys; one token a chunk, prompts of whole chunks.
std::vector<ChunkedRequest> Requests(std::initializer_list<std::vector<uint64_t>> keys) {
  std::vector<ChunkedRequest> out;
  for (const auto& k : keys) out.push_back({k, k.size()});
  return out;
}

// Capacity 3; requests [1 2], [1 2 3], [4 5], [1 2 3] (10 tokens).
//
// LRU (recency = last request; on a tie the deeper chunk goes first):
//   r0 [1 2]:   no hit; cache {1 2}
//   r1 [1 2 3]: 1 and 2 hit (2); 3 stored; cache {1 2 3}, all used by r1
//   r2 [4 5]:   no hit; storing 4 evicts 3 (r1's deepest), storing 5 evicts 2
//   r3 [1 2 3]: 1 hits, 2 misses (1); 2 and 3 stored (evict 5, then 4)
//   hits 0 + 2 + 0 + 1 = 3.
// Belady (next uses: 1 and 2 by r1 then r3, 3 by r3, 4 and 5 never):
//   r0: no hit; r1: 2 hits, 3 stored; r2: 4 and 5 are never used again, so
//   each is the victim of its own store (bypassed); r3: all 3 hit.
//   hits 0 + 2 + 0 + 3 = 5.
TEST(CacheReference, HandWorkedSequenceLruThreeBeladyFive) {
  const auto reqs = Requests({{1, 2}, {1, 2, 3}, {4, 5}, {1, 2, 3}});
  const CacheSimResult lru = SimulateLru(reqs, 3, 1);
  EXPECT_EQ(lru.requests, 4u);
  EXPECT_EQ(lru.prompt_tokens, 10u);
  EXPECT_EQ(lru.hit_tokens, 3u);
  EXPECT_DOUBLE_EQ(lru.TokenHitRate(), 0.3);
  const CacheSimResult opt = SimulateBelady(reqs, 3, 1);
  EXPECT_EQ(opt.hit_tokens, 5u);
  EXPECT_DOUBLE_EQ(opt.TokenHitRate(), 0.5);
}

// A hit stops at the first miss. Capacity 3, requests [1 2 3], [9], [9], [1 2 3]:
// LRU: r0 stores 1 2 3; r1 stores 9, evicting 3 (deepest of r0, the oldest);
// r2 hits 9 (1); r3 hits 1 and 2, 3 misses (2), and storing 3 evicts 9.
// hits 0 + 0 + 1 + 2 = 3. Chunk-count weight: 7 tokens a chunk -> 21 tokens.
TEST(CacheReference, AHitStopsAtTheFirstMissAndCountsChunkTokens) {
  auto reqs = Requests({{1, 2, 3}, {9}, {9}, {1, 2, 3}});
  for (auto& r : reqs) r.prompt_tokens = r.keys.size() * 7 + 3;  // a partial tail of 3 tokens
  const CacheSimResult lru = SimulateLru(reqs, 3, 7);
  EXPECT_EQ(lru.hit_tokens, 21u);
  EXPECT_EQ(lru.prompt_tokens, 8u * 7 + 4 * 3);
}

// A prompt longer than the cache: capacity 2, [1 2 3] twice. r0 stores 1 and
// 2; storing 3 makes it the victim under both policies (LRU: r0's deepest;
// Belady: 1, 2 and 3 all come back in r1, a tie the deeper loses). r1 hits
// 1 and 2, then 3 is dropped again: 2 hits each. Capacity 0 holds nothing.
TEST(CacheReference, APromptLongerThanTheCacheKeepsItsPrefix) {
  const auto reqs = Requests({{1, 2, 3}, {1, 2, 3}});
  EXPECT_EQ(SimulateLru(reqs, 2, 1).hit_tokens, 2u);
  EXPECT_EQ(SimulateBelady(reqs, 2, 1).hit_tokens, 2u);
  EXPECT_EQ(SimulateLru(reqs, 0, 1).hit_tokens, 0u);
  EXPECT_EQ(SimulateBelady(reqs, 0, 1).hit_tokens, 0u);
}

TraceRequest Req(std::vector<uint64_t> ids, uint64_t input_length) {
  TraceRequest r;
  r.hash_ids = std::move(ids);
  r.input_length = input_length;
  return r;
}

// Chunks are cut as kvtier-replay cuts the synthesized prompt: only full
// chunks, keyed by the tokens up to their end. With 256-token chunks:
// A = blocks [0 1 2], 1,300 tokens: 5 chunks (1,280 tokens; 20 left over);
// B = blocks [0 1 3], 1,100 tokens: 4 chunks, all within blocks 0 and 1 -> A's first 4;
// C = blocks [0 5], 700 tokens: 2 full chunks, both in block 0 -> A's first 2;
// D = blocks [0 1], 768 tokens (block 1 partial): chunk 2 is tokens 512-767 of
//     block 1, the same tokens as A's chunk 2.
// E = blocks [7 1 2], 1,300 tokens: another first block, so no chunk is A's.
TEST(CacheReference, ChunkTraceKeysEqualPrefixesEqually) {
  const std::vector<TraceRequest> trace = {Req({0, 1, 2}, 1300), Req({0, 1, 3}, 1100),
                                           Req({0, 5}, 700), Req({0, 1}, 768),
                                           Req({7, 1, 2}, 1300)};
  const auto c = ChunkTrace(trace, 256);
  ASSERT_EQ(c.size(), 5u);
  ASSERT_EQ(c[0].keys.size(), 5u);
  ASSERT_EQ(c[1].keys.size(), 4u);
  ASSERT_EQ(c[2].keys.size(), 2u);
  ASSERT_EQ(c[3].keys.size(), 3u);
  ASSERT_EQ(c[4].keys.size(), 5u);
  EXPECT_EQ(c[0].prompt_tokens, 1300u);
  for (size_t j = 0; j < 4; ++j) EXPECT_EQ(c[1].keys[j], c[0].keys[j]) << j;
  for (size_t j = 0; j < 2; ++j) EXPECT_EQ(c[2].keys[j], c[0].keys[j]) << j;
  for (size_t j = 0; j < 3; ++j) EXPECT_EQ(c[3].keys[j], c[0].keys[j]) << j;
  for (size_t j = 0; j < 5; ++j) EXPECT_NE(c[4].keys[j], c[0].keys[j]) << j;
  // Within a prompt every key differs (block 0 holds two chunks, not one).
  EXPECT_NE(c[0].keys[0], c[0].keys[1]);
  // 512-token chunks: A has 2 (1,024 tokens), B 2, C 1, D 1, E 2; B's 2 are A's.
  const auto big = ChunkTrace(trace, 512);
  EXPECT_EQ(big[0].keys.size(), 2u);
  EXPECT_EQ(big[2].keys.size(), 1u);
  EXPECT_EQ(big[1].keys, big[0].keys);
  // Replay of A then B, unbounded: B hits its 4 chunks of 256 = 1,024 tokens.
  const std::vector<ChunkedRequest> ab(c.begin(), c.begin() + 2);
  EXPECT_EQ(SimulateLru(ab, 1000, 256).hit_tokens, 1024u);
  EXPECT_EQ(SimulateBelady(ab, 1000, 256).hit_tokens, 1024u);
}

// Belady is optimal: never below LRU, on random prefix-structured traces
// (random block ids from a small alphabet, chained into prefixes by
// ChunkTrace), at every capacity; both reach the same figure when nothing is
// ever evicted.
TEST(CacheReference, BeladyIsNeverBelowLruOnRandomTraces) {
  std::mt19937_64 rng(7);
  int strictly_better = 0;
  for (int round = 0; round < 200; ++round) {
    std::vector<TraceRequest> trace;
    const int n = 5 + static_cast<int>(rng() % 30);
    for (int i = 0; i < n; ++i) {
      std::vector<uint64_t> ids(1 + rng() % 6);
      for (auto& id : ids) id = rng() % 3;
      const uint64_t len = ids.size() * 512 - rng() % 512;
      trace.push_back(Req(std::move(ids), len));
    }
    const auto reqs = ChunkTrace(trace, 256);
    for (uint64_t cap = 0; cap <= 12; ++cap) {
      const uint64_t lru = SimulateLru(reqs, cap, 256).hit_tokens;
      const uint64_t opt = SimulateBelady(reqs, cap, 256).hit_tokens;
      ASSERT_GE(opt, lru) << "round " << round << " capacity " << cap;
      strictly_better += opt > lru;
    }
    EXPECT_EQ(SimulateLru(reqs, 1u << 20, 256).hit_tokens,
              SimulateBelady(reqs, 1u << 20, 256).hit_tokens);
  }
  EXPECT_GT(strictly_better, 0) << "the property never told the two apart";
}

}  // namespace
}  // namespace kvtier::tools
