// ARC (Megiddo and Modha, "ARC: A Self-Tuning, Low Overhead Replacement
// Cache", FAST 2003) behind EvictionPolicy, leaf-first as the LRU is.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "handle_lists.h"
#include "kvtier/tiers/eviction_policy.h"

namespace kvtier {
namespace {

using handle_lists::kNil;
enum : uint8_t { kT1, kT2, kHeld, kLists };

// Per size class: T1 (chunks seen once since they came in, most recent at the
// head), T2 (chunks hit at least once), `held` (found held for a write), and
// the ghosts B1 and B2 of the chunks that left T1 and T2. `target` is ARC's
// p, the size T1 aims at: a chunk back from B1 (T1 was too small) raises it,
// one back from B2 lowers it; such a chunk enters T2. The victim is T1's least
// recent while T1 is over its target, else T2's. Leaf-first: a chunk the tier
// judges kBlocked is set aside until OnUnblocked puts it back at its list's
// least recent end (or OnAccess at T2's head).
struct ArcClass {
  uint64_t size = 0;
  size_t resident = 0;  // chunks of the class in the policy, wherever they are
  size_t target = 0;    // ARC's p: the size T1 aims at
  handle_lists::List lists[kLists];
  handle_lists::Ghost b1, b2;  // fingerprints of chunks that left T1, T2
};

class Arc final : public handle_lists::ListPolicy<Arc, ArcClass, kHeld> {
 public:
  void OnInsert(uint32_t h, uint64_t size_class, uint64_t fingerprint) override {
    ArcClass& c = Add(h, size_class, fingerprint);
    const size_t b1 = c.b1.size(), b2 = c.b2.size();
    if (c.b1.Take(fingerprint)) {
      c.target = std::min(c.resident, c.target + std::max<size_t>(1, b2 / b1));
      Push(h, kT2);
    } else if (c.b2.Take(fingerprint)) {
      const size_t down = std::max<size_t>(1, b1 / b2);
      c.target = c.target > down ? c.target - down : 0;
      Push(h, kT2);
    } else {
      Push(h, kT1);
    }
  }
  void OnAccess(uint32_t h) override {
    handle_lists::Node& n = nodes_[h];
    n.stamp = ++clock_;
    if (n.where == kHeld) {
      n.queue = kT2;  // where it goes when its write is done
      return;
    }
    handle_lists::Unlink(nodes_, classes_[n.cls].lists, h);
    Push(h, kT2);
  }
  void OnRemove(uint32_t h) override {
    const handle_lists::Node& n = nodes_[h];
    ArcClass& c = Drop(h);
    (n.queue == kT1 ? c.b1 : c.b2).Add(n.fingerprint, c.resident + 1);
  }

  // Each chunk looked at goes or leaves T1 and T2 until an event brings it back.
  std::optional<uint32_t> Pick(uint16_t c, bool take_held,
                               const std::function<Verdict(uint32_t)>& verdict) {
    ArcClass& k = classes_[c];
    handle_lists::List& t1 = k.lists[kT1];
    handle_lists::List& t2 = k.lists[kT2];
    while (t1.tail != kNil || t2.tail != kNil) {
      const bool from_t1 = t1.tail != kNil && (t2.tail == kNil || t1.size > k.target);
      const uint32_t h = from_t1 ? t1.tail : t2.tail;
      // OnRemove remembers it in B1 or B2.
      if (handle_lists::Judge(nodes_, k.lists, h, kHeld, verdict)) return h;
    }
    return handle_lists::PickHeld(nodes_, k.lists, kHeld, take_held, verdict);
  }
};

}  // namespace

std::unique_ptr<EvictionPolicy> NewArcPolicy() { return std::make_unique<Arc>(); }

}  // namespace kvtier
