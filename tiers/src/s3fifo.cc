// S3-FIFO (Yang et al., "FIFO queues are all you need for cache eviction",
// SOSP 2023) behind EvictionPolicy, leaf-first as the LRU is.
#include <cstdint>
#include <vector>

#include "handle_lists.h"
#include "kvtier/tiers/eviction_policy.h"

namespace kvtier {
namespace {

using handle_lists::kAside;
using handle_lists::kNil;
constexpr uint8_t kMaxFreq = 3;
enum : uint8_t { kSmall, kMain, kHeld, kLists };

// Per size class, three FIFO queues over handles (newest at the head):
// `small` (new chunks, about a tenth of the class), `main` (chunks hit while
// in small, or seen again soon after leaving it) and `held` (found held for a
// write), and a ghost FIFO of the fingerprints of chunks removed from small.
// Each chunk counts its hits since it entered its queue, up to 3. The small
// queue's tail goes when unhit, or moves to main when hit; main's tail goes
// when unhit, or goes round again with one hit less. A chunk the tier judges
// kBlocked is in no queue ("aside") until OnUnblocked puts it back at the
// tail of the queue it left (or OnAccess at the head).
struct S3FifoClass {
  uint64_t size = 0;
  size_t resident = 0;  // chunks of the class in the policy, wherever they are
  handle_lists::List lists[kLists];
  handle_lists::Ghost ghost;  // fingerprints of chunks that left small
};

class S3Fifo final : public handle_lists::ListPolicy<S3Fifo, S3FifoClass, kHeld> {
 public:
  void OnInsert(uint32_t h, uint64_t size_class, uint64_t fingerprint) override {
    S3FifoClass& c = Add(h, size_class, fingerprint);
    Push(h, c.ghost.Take(fingerprint) ? kMain : kSmall);
  }
  void OnAccess(uint32_t h) override {
    handle_lists::Node& n = nodes_[h];
    if (n.freq < kMaxFreq) ++n.freq;
    n.stamp = ++clock_;
    if (n.where == kAside) Push(h, n.queue);
  }
  void OnRemove(uint32_t h) override {
    const handle_lists::Node& n = nodes_[h];
    S3FifoClass& c = Drop(h);
    if (n.queue == kSmall) c.ghost.Add(n.fingerprint, c.resident + 1);
  }

  // The next chunk of class `c` to evict. Each chunk looked at goes, moves
  // within the queues (a hit spent), or leaves them until an event brings it
  // back: every step spends a hit or a queue place, so the search ends.
  std::optional<uint32_t> Pick(uint16_t c, bool take_held,
                               const std::function<Verdict(uint32_t)>& verdict) {
    S3FifoClass& k = classes_[c];
    handle_lists::List& small = k.lists[kSmall];
    handle_lists::List& main = k.lists[kMain];
    while (small.tail != kNil || main.tail != kNil) {
      const bool from_small = main.tail == kNil || small.size * 10 >= k.resident;
      const uint32_t h = from_small ? small.tail : main.tail;
      handle_lists::Node& n = nodes_[h];
      if (n.freq > 0) {  // hit in its queue: to main's head (from small), or round again
        handle_lists::Unlink(nodes_, k.lists, h);
        n.freq = from_small ? 0 : n.freq - 1;
        Push(h, kMain);
        continue;
      }
      // OnRemove remembers it if it leaves small.
      if (handle_lists::Judge(nodes_, k.lists, h, kHeld, verdict)) return h;
    }
    return handle_lists::PickHeld(nodes_, k.lists, kHeld, take_held, verdict);
  }
};

}  // namespace

std::unique_ptr<EvictionPolicy> NewS3FifoPolicy() { return std::make_unique<S3Fifo>(); }

}  // namespace kvtier
