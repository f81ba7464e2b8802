#include <vector>

#include "kvtier/tiers/eviction_policy.h"

namespace kvtier {
namespace {

constexpr uint32_t kNil = UINT32_MAX;

// Intrusive doubly-linked list over handles: head_ is the most recent.
class LeafFirstLru final : public EvictionPolicy {
 public:
  void OnInsert(uint32_t h) override {
    if (h >= prev_.size()) {
      prev_.resize(h + 1, kNil);
      next_.resize(h + 1, kNil);
    }
    PushFront(h);
  }
  void OnAccess(uint32_t h) override {
    Unlink(h);
    PushFront(h);
  }
  void OnRemove(uint32_t h) override { Unlink(h); }

  std::optional<uint32_t> PickVictim(const std::function<bool(uint32_t)>& evictable) override {
    for (uint32_t h = tail_; h != kNil; h = prev_[h]) {
      if (evictable(h)) return h;
    }
    return std::nullopt;
  }

 private:
  void PushFront(uint32_t h) {
    prev_[h] = kNil;
    next_[h] = head_;
    if (head_ != kNil) prev_[head_] = h;
    head_ = h;
    if (tail_ == kNil) tail_ = h;
  }
  void Unlink(uint32_t h) {
    if (prev_[h] == kNil && head_ != h) return;  // not linked
    if (prev_[h] != kNil) next_[prev_[h]] = next_[h]; else head_ = next_[h];
    if (next_[h] != kNil) prev_[next_[h]] = prev_[h]; else tail_ = prev_[h];
    prev_[h] = next_[h] = kNil;
  }

  std::vector<uint32_t> prev_;
  std::vector<uint32_t> next_;
  uint32_t head_ = kNil;
  uint32_t tail_ = kNil;
};

}  // namespace

std::unique_ptr<EvictionPolicy> NewLeafFirstLruPolicy() { return std::make_unique<LeafFirstLru>(); }

}  // namespace kvtier
