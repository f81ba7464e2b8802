#include "kvtier/tiers/dram_tier.h"

namespace kvtier {

Result<std::unique_ptr<DramTier>> DramTier::Create(uint64_t arena_bytes, uint64_t epoch,
                                                   std::unique_ptr<EvictionPolicy> policy) {
  auto arena = Arena::Create(arena_bytes, epoch);
  if (!arena.ok()) return arena.status();
  return std::unique_ptr<DramTier>(new DramTier(std::move(arena).value(), std::move(policy)));
}

}  // namespace kvtier
