// kvtier-bench evict: the cost of making room in a full tier, in process (no daemon).
// A SlotTier (bookkeeping only, no memory) of `chunks` 4 KiB slots is filled with prefix
// chains of `chain_length` chunks (a 128K-token prompt is 256 chunks of 512 tokens),
// then as many chunks again are stored, each evicting one: the least recently used
// chunk with no resident child, leaf-first through the old chains. Two workloads: fresh
// prompts only, and fresh prompts each after a hit on a resident prompt (touched
// children first, as a Lookup does). Baseline in the same run: the fill of the empty
// tier, the same stores with no eviction. Prints ns per store, the ratio, and the chunks
// the victim search looked at per eviction.
#pragma once

#include <cstdint>

namespace kvtier::bench {

// Exit status: 0, or 1 when a store found no slot (a bug: every chunk is evictable).
int RunEvict(uint64_t chunks, uint64_t chain_length);

}  // namespace kvtier::bench
