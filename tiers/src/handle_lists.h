// What the FIFO-based eviction policies (s3fifo.cc, arc.cc) are built of:
// intrusive doubly-linked lists over chunk handles, a few per size class,
// newest at the head, and ghost FIFOs that remember chunks by fingerprint
// after they left (handles are reused; keys are not).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <unordered_map>
#include <vector>

#include "kvtier/tiers/eviction_policy.h"
#include "size_classes.h"

namespace kvtier::handle_lists {

inline constexpr uint32_t kNil = UINT32_MAX;
// Node::where beside a list number: in no list.
inline constexpr uint8_t kAside = 0xfe;   // set aside until an event brings it back
inline constexpr uint8_t kAbsent = 0xff;  // not in the policy

struct Node {
  uint32_t prev = kNil;
  uint32_t next = kNil;
  uint32_t stamp = 0;  // the policy's clock at its insert or last access
  uint64_t fingerprint = 0;
  uint16_t cls = 0;
  uint8_t freq = 0;         // hits counted by the policy
  uint8_t where = kAbsent;  // a list of its class, kAside or kAbsent
  uint8_t queue = 0;        // the list it goes back to from aside or held
};

struct List {
  uint32_t head = kNil;
  uint32_t tail = kNil;
  size_t size = 0;
};

// `lists`: the lists of h's class.
inline void PushFront(std::vector<Node>& nodes, List* lists, uint32_t h, uint8_t where) {
  Node& n = nodes[h];
  List& l = lists[where];
  n.where = where;
  n.prev = kNil;
  n.next = l.head;
  if (l.head != kNil)
    nodes[l.head].prev = h;
  else
    l.tail = h;
  l.head = h;
  ++l.size;
}

inline void PushBack(std::vector<Node>& nodes, List* lists, uint32_t h, uint8_t where) {
  Node& n = nodes[h];
  List& l = lists[where];
  n.where = where;
  n.next = kNil;
  n.prev = l.tail;
  if (l.tail != kNil)
    nodes[l.tail].next = h;
  else
    l.head = h;
  l.tail = h;
  ++l.size;
}

// Takes `h` out of its list, if it is in one: it is then aside.
inline void Unlink(std::vector<Node>& nodes, List* lists, uint32_t h) {
  Node& n = nodes[h];
  if (n.where == kAside || n.where == kAbsent) return;
  List& l = lists[n.where];
  if (n.prev != kNil)
    nodes[n.prev].next = n.next;
  else
    l.head = n.next;
  if (n.next != kNil)
    nodes[n.next].prev = n.prev;
  else
    l.tail = n.prev;
  n.prev = n.next = kNil;
  --l.size;
  n.where = kAside;
}

// A search's step on `h`, the tail of one of its class's lists: true when the
// tier judged that it can go (the search returns it); else it is set aside
// (kBlocked) or moved to list `held` (kHeld).
inline bool Judge(std::vector<Node>& nodes, List* lists, uint32_t h, uint8_t held,
                  const std::function<EvictionPolicy::Verdict(uint32_t)>& verdict) {
  switch (verdict(h)) {
    case EvictionPolicy::Verdict::kEvict:
      return true;
    case EvictionPolicy::Verdict::kBlocked:
      Unlink(nodes, lists, h);
      break;
    case EvictionPolicy::Verdict::kHeld:
      Unlink(nodes, lists, h);
      PushFront(nodes, lists, h, held);
      break;
  }
  return false;
}

// With `take_held`, the least recent chunk of list `held` that is not blocked
// (blocked ones are set aside on the way).
inline std::optional<uint32_t> PickHeld(
    std::vector<Node>& nodes, List* lists, uint8_t held, bool take_held,
    const std::function<EvictionPolicy::Verdict(uint32_t)>& verdict) {
  while (take_held && lists[held].tail != kNil) {
    const uint32_t h = lists[held].tail;
    if (verdict(h) != EvictionPolicy::Verdict::kBlocked) return h;
    Unlink(nodes, lists, h);
  }
  return std::nullopt;
}

// A FIFO of fingerprints of chunks that left, at most `bound` long.
class Ghost {
 public:
  void Add(uint64_t fingerprint, size_t bound) {
    fifo_.push_back(fingerprint);
    ++count_[fingerprint];
    while (fifo_.size() > bound) {
      auto it = count_.find(fifo_.front());
      if (it != count_.end() && --it->second == 0) count_.erase(it);
      fifo_.pop_front();
    }
  }
  // Whether it is remembered; it is forgotten (its FIFO places stay until
  // they fall off the end).
  bool Take(uint64_t fingerprint) { return count_.erase(fingerprint) > 0; }
  size_t size() const { return count_.size(); }

 private:
  std::deque<uint64_t> fifo_;                     // oldest at the front
  std::unordered_map<uint64_t, uint32_t> count_;  // fingerprint -> its places in fifo_
};

// What the list policies share: their nodes and classes, and the events and
// the class choice that work alike. `Class` has `size`, `resident` and
// `List lists[]`; `kHeldList` is the number of its held list; `Derived` has
// Pick(class, take_held, verdict), the victim of one class.
template <typename Derived, typename Class, uint8_t kHeldList>
class ListPolicy : public EvictionPolicy {
 public:
  void Reserve(size_t max_handles) override { nodes_.reserve(max_handles); }
  // Back at the least recent end of the list it left.
  void OnUnblocked(uint32_t h) override {
    if (h >= nodes_.size()) return;
    Node& n = nodes_[h];
    if (n.where != kAside && n.where != kHeldList) return;
    List* lists = classes_[n.cls].lists;
    Unlink(nodes_, lists, h);
    PushBack(nodes_, lists, h, n.queue);
  }
  std::optional<uint32_t> PickVictim(uint64_t size_class, bool take_held,
                                     const std::function<Verdict(uint32_t)>& verdict) override {
    return size_classes::PickVictim(
        classes_, size_class,
        [&](uint16_t c) { return static_cast<Derived*>(this)->Pick(c, take_held, verdict); },
        [&](uint32_t h) { return nodes_[h].stamp; });
  }

 protected:
  // A fresh node for `h` (in no list yet), counted in its class; its class.
  Class& Add(uint32_t h, uint64_t size_class, uint64_t fingerprint) {
    if (h >= nodes_.size()) nodes_.resize(h + 1);
    Node& n = nodes_[h];
    n.cls = size_classes::IndexOf(classes_, size_class);
    n.freq = 0;
    n.stamp = ++clock_;
    n.fingerprint = fingerprint;
    Class& c = classes_[n.cls];
    ++c.resident;
    return c;
  }
  // Takes `h` out of the policy; its class.
  Class& Drop(uint32_t h) {
    Node& n = nodes_[h];
    Class& c = classes_[n.cls];
    Unlink(nodes_, c.lists, h);
    --c.resident;
    n.where = kAbsent;
    return c;
  }
  // To the head of list `where` of its class (a list other than held: the one
  // it goes back to, too).
  void Push(uint32_t h, uint8_t where) {
    if (where != kHeldList) nodes_[h].queue = where;
    PushFront(nodes_, classes_[nodes_[h].cls].lists, h, where);
  }

  std::vector<Node> nodes_;
  std::vector<Class> classes_;
  uint32_t clock_ = 0;
};

}  // namespace kvtier::handle_lists
