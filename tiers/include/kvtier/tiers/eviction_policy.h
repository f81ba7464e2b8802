// EvictionPolicy: decides which chunk of a tier to evict (policy apart from
// mechanism: the tier stores bytes, the index records where, this picks).
//
// Chunks are named by the small integer handles of ChunkIndex, and belong to a
// size class (their slot size): a victim is picked within one class. The tier
// tells the policy about inserts, accesses and removals, and judges each chunk
// the search looks at (Verdict). A chunk that cannot go now is set aside until
// the tier says the reason has ended (OnUnblocked), so the search never looks
// at it again meanwhile: the search costs O(1) amortised per insert, access,
// unblock and eviction, however many chunks are leased or have a child.
//
// Thread-safety: not thread-safe; the owning tier serializes calls.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>

#include "kvtier/status.h"

namespace kvtier {

class EvictionPolicy {
 public:
  // What the tier says of a chunk the search looks at.
  enum class Verdict {
    kEvict,    // it can go now
    kBlocked,  // not until OnUnblocked: it is leased, or has a resident child
    kHeld,     // held for a write to a lower tier: it goes only with `take_held`
  };
  // PickVictim's class for "any size".
  static constexpr uint64_t kAnyClass = 0;

  virtual ~EvictionPolicy() = default;
  // Room for handles below `max_handles` without regrowing (address space
  // only: nothing is touched until used). Optional.
  virtual void Reserve(size_t /*max_handles*/) {}
  // REQUIRES: size_class != kAnyClass; `handle` is not in the policy.
  // `fingerprint`: 64 bits of the chunk's key, for a policy that remembers
  // chunks after they left (handles are reused; keys are not).
  virtual void OnInsert(uint32_t handle, uint64_t size_class, uint64_t fingerprint = 0) = 0;
  virtual void OnAccess(uint32_t handle) = 0;
  virtual void OnRemove(uint32_t handle) = 0;
  // The reason a chunk was judged kBlocked or kHeld has ended: its last
  // resident child left, its last lease ended, or its write hold was released.
  // A chunk that was not set aside is left where it is.
  virtual void OnUnblocked(uint32_t handle) = 0;
  // The chunk of `size_class` (kAnyClass: of any class, the least recent of
  // each class's pick) to evict next, or nullopt when none can go. Chunks
  // judged kHeld go only when `take_held` and nothing else of the class can
  // (so with kAnyClass, a held chunk of one class may go before a plain one of
  // another).
  virtual std::optional<uint32_t> PickVictim(uint64_t size_class, bool take_held,
                                             const std::function<Verdict(uint32_t)>& verdict) = 0;
};

// Least recently used first, among chunks the tier judges kEvict. With the
// tier's verdict "no lease and no resident child" this is DESIGN.md's
// leaf-first LRU: a prefix never loses an inner chunk while its descendants
// stay. A chunk set aside comes back at the least recent end: it was the least
// recently used when set aside, and has not been used since (an access brings
// it back as the most recent). Its order among others set aside is the order
// they come back in.
std::unique_ptr<EvictionPolicy> NewLeafFirstLruPolicy();

// S3-FIFO (Yang et al., SOSP 2023), leaf-first in the same way: a new chunk
// waits in a small FIFO (a tenth of its class) and goes unless hit there; a
// hit one moves to the main FIFO, where a chunk goes round again while it has
// hits left (at most 3). A chunk seen again soon after it left small (a ghost
// FIFO of fingerprints, as many as the class holds chunks) enters main at
// once. Memory: about 40 bytes per ghost entry beyond the LRU's node.
std::unique_ptr<EvictionPolicy> NewS3FifoPolicy();

// ARC (Megiddo and Modha, FAST 2003), leaf-first in the same way: chunks seen
// once (T1) and chunks hit again (T2), each with a ghost list of fingerprints
// of those that left; a chunk back from a ghost list moves T1's target size
// toward the list that lost it. Memory: as S3-FIFO's, two ghosts.
std::unique_ptr<EvictionPolicy> NewArcPolicy();

// The policies a tier can run (kvtierd --dram-eviction and the like).
enum class EvictionPolicyKind { kLru, kS3Fifo, kArc };
// "lru", "s3fifo" or "arc"; an error names the value and the choices.
Result<EvictionPolicyKind> ParseEvictionPolicy(std::string_view name);
const char* EvictionPolicyName(EvictionPolicyKind kind);
std::unique_ptr<EvictionPolicy> NewEvictionPolicy(EvictionPolicyKind kind);

}  // namespace kvtier
