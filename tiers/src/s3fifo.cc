// S3-FIFO (Yang et al., "FIFO queues are all you need for cache eviction",
// SOSP 2023) behind EvictionPolicy, leaf-first as the LRU is.
#include <cstdint>
#include <deque>
#include <unordered_map>
#include <vector>

#include "kvtier/tiers/eviction_policy.h"
#include "size_classes.h"

namespace kvtier {
namespace {

constexpr uint32_t kNil = UINT32_MAX;
constexpr uint8_t kMaxFreq = 3;

// Per size class, three FIFO queues over handles (newest at the head):
// `small` (new chunks, about a tenth of the class), `main` (chunks hit while
// in small, or seen again soon after leaving it) and `held` (found held for a
// write), and a ghost FIFO of the fingerprints of chunks removed from small.
// Each chunk counts its hits since it entered its queue, up to 3. The small
// queue's tail goes when unhit, or moves to main when hit; main's tail goes
// when unhit, or goes round again with one hit less. A chunk the tier judges
// kBlocked is in no queue ("aside") until OnUnblocked puts it back at the
// tail of the queue it left (or OnAccess at the head).
class S3Fifo final : public EvictionPolicy {
 public:
  void Reserve(size_t max_handles) override { nodes_.reserve(max_handles); }
  void OnInsert(uint32_t h, uint64_t size_class, uint64_t fingerprint) override {
    if (h >= nodes_.size()) nodes_.resize(h + 1);
    Node& n = nodes_[h];
    n.cls = ClassOf(size_class);
    n.freq = 0;
    n.stamp = ++clock_;
    n.fingerprint = fingerprint;
    Class& c = classes_[n.cls];
    ++c.resident;
    const bool seen = c.ghost_count.erase(fingerprint) > 0;  // its ghost stays in the FIFO
    PushFront(h, seen ? Where::kMain : Where::kSmall);
  }
  void OnAccess(uint32_t h) override {
    Node& n = nodes_[h];
    if (n.freq < kMaxFreq) ++n.freq;
    n.stamp = ++clock_;
    if (n.where == Where::kAside) PushFront(h, n.queue);
  }
  void OnRemove(uint32_t h) override {
    Unlink(h);
    Class& c = classes_[nodes_[h].cls];
    --c.resident;
    if (nodes_[h].queue == Where::kSmall) Remember(c, nodes_[h].fingerprint);
    nodes_[h].where = Where::kAbsent;
  }
  void OnUnblocked(uint32_t h) override {
    if (h >= nodes_.size() || nodes_[h].where != Where::kAside) {
      if (h < nodes_.size() && nodes_[h].where == Where::kHeld) {
        Unlink(h);
        PushBack(h, nodes_[h].queue);
      }
      return;
    }
    PushBack(h, nodes_[h].queue);
  }

  std::optional<uint32_t> PickVictim(uint64_t size_class, bool take_held,
                                     const std::function<Verdict(uint32_t)>& verdict) override {
    return size_classes::PickVictim(
        classes_, size_class, [&](uint16_t c) { return Pick(c, take_held, verdict); },
        [&](uint32_t h) { return nodes_[h].stamp; });
  }

 private:
  enum class Where : uint8_t { kAbsent, kSmall, kMain, kHeld, kAside };
  struct Node {
    uint32_t prev = kNil;
    uint32_t next = kNil;
    uint32_t stamp = 0;  // the clock at its insert or last access (kAnyClass order)
    uint64_t fingerprint = 0;
    uint16_t cls = 0;
    uint8_t freq = 0;
    Where where = Where::kAbsent;
    Where queue = Where::kSmall;  // small or main: where it goes back to from aside or held
  };
  struct List {
    uint32_t head = kNil;
    uint32_t tail = kNil;
    size_t size = 0;
  };
  struct Class {
    uint64_t size;
    size_t resident = 0;  // chunks of the class in the policy, wherever they are
    List small, main, held;
    std::deque<uint64_t> ghost;  // fingerprints, oldest at the front
    std::unordered_map<uint64_t, uint32_t> ghost_count;  // fingerprint -> live entries
  };

  // The next chunk of class `c` to evict. Each chunk looked at goes, moves
  // within the queues (a hit spent), or leaves them until an event brings it
  // back: every step spends a hit or a queue place, so the search ends.
  std::optional<uint32_t> Pick(uint16_t c, bool take_held,
                               const std::function<Verdict(uint32_t)>& verdict) {
    Class& k = classes_[c];
    while (k.small.tail != kNil || k.main.tail != kNil) {
      const bool from_small = k.main.tail == kNil || k.small.size * 10 >= k.resident;
      const uint32_t h = from_small ? k.small.tail : k.main.tail;
      Node& n = nodes_[h];
      if (n.freq > 0) {  // hit in its queue: to main's head (from small), or round again
        Unlink(h);
        n.freq = from_small ? 0 : n.freq - 1;
        PushFront(h, Where::kMain);
        continue;
      }
      switch (verdict(h)) {
        case Verdict::kEvict: return h;  // OnRemove remembers it if it leaves small
        case Verdict::kBlocked: Unlink(h); break;  // aside
        case Verdict::kHeld:
          Unlink(h);
          PushFront(h, Where::kHeld);
          break;
      }
    }
    while (take_held && k.held.tail != kNil) {
      const uint32_t h = k.held.tail;
      if (verdict(h) != Verdict::kBlocked) return h;
      Unlink(h);  // aside
    }
    return std::nullopt;
  }

  // The ghost holds about as many fingerprints as the class holds chunks.
  void Remember(Class& k, uint64_t fingerprint) {
    k.ghost.push_back(fingerprint);
    ++k.ghost_count[fingerprint];
    while (k.ghost.size() > k.resident + 1) {
      auto it = k.ghost_count.find(k.ghost.front());
      if (it != k.ghost_count.end() && --it->second == 0) k.ghost_count.erase(it);
      k.ghost.pop_front();
    }
  }

  uint16_t ClassOf(uint64_t size) { return size_classes::IndexOf(classes_, size); }
  List& ListOf(const Node& n) {
    Class& c = classes_[n.cls];
    return n.where == Where::kHeld ? c.held : n.where == Where::kMain ? c.main : c.small;
  }
  void PushFront(uint32_t h, Where where) {
    Node& n = nodes_[h];
    n.where = where;
    if (where != Where::kHeld) n.queue = where;
    List& l = ListOf(n);
    n.prev = kNil;
    n.next = l.head;
    if (l.head != kNil) nodes_[l.head].prev = h; else l.tail = h;
    l.head = h;
    ++l.size;
  }
  void PushBack(uint32_t h, Where where) {
    Node& n = nodes_[h];
    n.where = where;
    n.queue = where;
    List& l = ListOf(n);
    n.next = kNil;
    n.prev = l.tail;
    if (l.tail != kNil) nodes_[l.tail].next = h; else l.head = h;
    l.tail = h;
    ++l.size;
  }
  // Takes `h` out of its queue, if it is in one: it is then aside.
  void Unlink(uint32_t h) {
    Node& n = nodes_[h];
    if (n.where == Where::kAbsent || n.where == Where::kAside) return;
    List& l = ListOf(n);
    if (n.prev != kNil) nodes_[n.prev].next = n.next; else l.head = n.next;
    if (n.next != kNil) nodes_[n.next].prev = n.prev; else l.tail = n.prev;
    n.prev = n.next = kNil;
    --l.size;
    n.where = Where::kAside;
  }

  std::vector<Node> nodes_;
  std::vector<Class> classes_;
  uint32_t clock_ = 0;
};

}  // namespace

std::unique_ptr<EvictionPolicy> NewS3FifoPolicy() { return std::make_unique<S3Fifo>(); }

}  // namespace kvtier
