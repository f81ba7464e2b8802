#include <string>
#include <vector>

#include "kvtier/tiers/eviction_policy.h"
#include "size_classes.h"

namespace kvtier {
namespace {

constexpr uint32_t kNil = UINT32_MAX;

// Per size class, two intrusive doubly-linked lists over handles, most recent
// at the head: `lru` (chunks the search may pick) and `held` (chunks it found
// held for a write, in the order it found them). A chunk judged kBlocked is in
// neither ("aside") until OnUnblocked or OnAccess.
class LeafFirstLru final : public EvictionPolicy {
 public:
  void Reserve(size_t max_handles) override { nodes_.reserve(max_handles); }
  void OnInsert(uint32_t h, uint64_t size_class, uint64_t /*fingerprint*/) override {
    if (h >= nodes_.size()) nodes_.resize(h + 1);
    nodes_[h].cls = ClassOf(size_class);
    nodes_[h].stamp = ++clock_;
    PushFront(h, Where::kLru);
  }
  void OnAccess(uint32_t h) override {
    Unlink(h);
    nodes_[h].stamp = ++clock_;
    PushFront(h, Where::kLru);
  }
  void OnRemove(uint32_t h) override {
    Unlink(h);
    nodes_[h].where = Where::kAbsent;
  }
  void OnUnblocked(uint32_t h) override {
    if (h >= nodes_.size() || nodes_[h].where == Where::kAbsent || nodes_[h].where == Where::kLru) {
      return;
    }
    Unlink(h);
    PushBack(h);
  }

  std::optional<uint32_t> PickVictim(uint64_t size_class, bool take_held,
                                     const std::function<Verdict(uint32_t)>& verdict) override {
    return size_classes::PickVictim(
        classes_, size_class, [&](uint16_t c) { return Pick(c, take_held, verdict); },
        [&](uint32_t h) { return nodes_[h].stamp; });
  }

 private:
  enum class Where : uint8_t { kAbsent, kLru, kHeld, kAside };
  struct Node {
    uint32_t prev = kNil;
    uint32_t next = kNil;
    uint32_t stamp = 0;  // the clock at its last insert or access
    uint16_t cls = 0;
    Where where = Where::kAbsent;
  };
  struct List {
    uint32_t head = kNil;
    uint32_t tail = kNil;
  };
  struct Class {
    uint64_t size;
    List lru, held;
  };

  // The least recent chunk of class `c` that can go. Each chunk it looks at
  // either goes or leaves the lists it searches until an event brings it back.
  std::optional<uint32_t> Pick(uint16_t c, bool take_held,
                               const std::function<Verdict(uint32_t)>& verdict) {
    while (classes_[c].lru.tail != kNil) {
      const uint32_t h = classes_[c].lru.tail;
      switch (verdict(h)) {
        case Verdict::kEvict:
          return h;
        case Verdict::kBlocked:
          Unlink(h);
          break;  // aside
        case Verdict::kHeld:
          Unlink(h);
          PushFront(h, Where::kHeld);
          break;
      }
    }
    while (take_held && classes_[c].held.tail != kNil) {
      const uint32_t h = classes_[c].held.tail;
      if (verdict(h) != Verdict::kBlocked) return h;
      Unlink(h);  // aside
    }
    return std::nullopt;
  }

  uint16_t ClassOf(uint64_t size) { return size_classes::IndexOf(classes_, size); }
  List& ListOf(uint32_t h) {
    Class& c = classes_[nodes_[h].cls];
    return nodes_[h].where == Where::kHeld ? c.held : c.lru;
  }
  void PushFront(uint32_t h, Where where) {
    Node& n = nodes_[h];
    n.where = where;
    List& l = ListOf(h);
    n.prev = kNil;
    n.next = l.head;
    if (l.head != kNil)
      nodes_[l.head].prev = h;
    else
      l.tail = h;
    l.head = h;
  }
  void PushBack(uint32_t h) {
    Node& n = nodes_[h];
    n.where = Where::kLru;
    List& l = ListOf(h);
    n.next = kNil;
    n.prev = l.tail;
    if (l.tail != kNil)
      nodes_[l.tail].next = h;
    else
      l.head = h;
    l.tail = h;
  }
  // Takes `h` out of its list, if it is in one: it is then aside.
  void Unlink(uint32_t h) {
    Node& n = nodes_[h];
    if (n.where != Where::kLru && n.where != Where::kHeld) return;
    List& l = ListOf(h);
    if (n.prev != kNil)
      nodes_[n.prev].next = n.next;
    else
      l.head = n.next;
    if (n.next != kNil)
      nodes_[n.next].prev = n.prev;
    else
      l.tail = n.prev;
    n.prev = n.next = kNil;
    n.where = Where::kAside;
  }

  std::vector<Node> nodes_;
  std::vector<Class> classes_;
  uint32_t clock_ = 0;
};

}  // namespace

std::unique_ptr<EvictionPolicy> NewLeafFirstLruPolicy() { return std::make_unique<LeafFirstLru>(); }

Result<EvictionPolicyKind> ParseEvictionPolicy(std::string_view name) {
  if (name == "lru") return EvictionPolicyKind::kLru;
  if (name == "s3fifo") return EvictionPolicyKind::kS3Fifo;
  if (name == "arc") return EvictionPolicyKind::kArc;
  return Status::InvalidArgument("eviction policy '" + std::string(name) +
                                 "' is unknown (lru, s3fifo, arc)");
}

const char* EvictionPolicyName(EvictionPolicyKind kind) {
  switch (kind) {
    case EvictionPolicyKind::kS3Fifo:
      return "s3fifo";
    case EvictionPolicyKind::kArc:
      return "arc";
    case EvictionPolicyKind::kLru:
      break;
  }
  return "lru";
}

std::unique_ptr<EvictionPolicy> NewEvictionPolicy(EvictionPolicyKind kind) {
  switch (kind) {
    case EvictionPolicyKind::kS3Fifo:
      return NewS3FifoPolicy();
    case EvictionPolicyKind::kArc:
      return NewArcPolicy();
    case EvictionPolicyKind::kLru:
      break;
  }
  return NewLeafFirstLruPolicy();
}

}  // namespace kvtier
