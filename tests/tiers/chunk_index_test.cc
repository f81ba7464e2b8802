// ChunkIndex::SubtreesDeepestFirst: the chunks picked plus all their
// descendants, each child before its parent (the order of a leaf-first removal).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "kvtier/tiers/chunk_index.h"

namespace kvtier {
namespace {

ChunkKey K(uint64_t n) { return ChunkKey{n, 0}; }
constexpr uint64_t kRoot = 1000;  // the namespace id: parent of first chunks, never an entry

class SubtreesTest : public ::testing::Test {
 protected:
  // key -> parent key
  void Add(uint64_t key, uint64_t parent) {
    ChunkEntry e;
    e.key = K(key);
    e.parent = K(parent);
    handle_[key] = index_.Insert(e);
    parent_[key] = parent;
  }
  // The keys SubtreesDeepestFirst returns when picking `picked`.
  std::vector<uint64_t> Run(std::set<uint64_t> picked) {
    std::vector<uint64_t> keys;
    for (uint32_t h : index_.SubtreesDeepestFirst(
             [&](uint32_t h) { return picked.count(index_.Get(h).key.lo) != 0; })) {
      keys.push_back(index_.Get(h).key.lo);
    }
    return keys;
  }
  // Every child listed comes before its parent.
  void ExpectChildrenFirst(const std::vector<uint64_t>& keys) {
    for (size_t i = 0; i < keys.size(); ++i) {
      auto parent = std::find(keys.begin(), keys.end(), parent_[keys[i]]);
      if (parent != keys.end()) {
        EXPECT_GT(parent - keys.begin(), static_cast<ptrdiff_t>(i))
            << keys[i] << " listed after its parent " << parent_[keys[i]];
      }
    }
  }

  ChunkIndex index_;
  std::map<uint64_t, uint32_t> handle_;
  std::map<uint64_t, uint64_t> parent_;
};

TEST_F(SubtreesTest, PickedChunkAndEveryDescendantDeepestFirst) {
  // 1 -> 2 -> 3 -> 4, 2 -> 5 -> 6, 1 -> 7; a second tree 8 -> 9.
  // Inserted out of order so that the walk meets children before parents.
  Add(1, kRoot);
  Add(6, 5);
  Add(4, 3);
  Add(2, 1);
  Add(3, 2);
  Add(5, 2);
  Add(7, 1);
  Add(9, 8);
  Add(8, kRoot);
  std::vector<uint64_t> got = Run({2});
  EXPECT_EQ(std::set<uint64_t>(got.begin(), got.end()), (std::set<uint64_t>{2, 3, 4, 5, 6}));
  EXPECT_EQ(got.size(), 5u) << "each chunk once";
  ExpectChildrenFirst(got);
  EXPECT_EQ(got.back(), 2u);

  got = Run({1, 8});
  EXPECT_EQ(got.size(), 9u);
  ExpectChildrenFirst(got);
  EXPECT_TRUE(Run({}).empty());
  got = Run({4, 9});
  EXPECT_EQ(std::set<uint64_t>(got.begin(), got.end()), (std::set<uint64_t>{4, 9}));
}

TEST_F(SubtreesTest, APickedChunkInsideAPickedSubtreeIsListedOnce) {
  Add(1, kRoot);
  Add(2, 1);
  Add(3, 2);
  const std::vector<uint64_t> got = Run({1, 2, 3});
  EXPECT_EQ(got, (std::vector<uint64_t>{3, 2, 1}));
}

TEST_F(SubtreesTest, ErasedHandlesAreNotListed) {
  Add(1, kRoot);
  Add(2, 1);
  index_.Erase(handle_[2]);
  Add(3, 1);  // may reuse 2's handle
  const std::vector<uint64_t> got = Run({1});
  EXPECT_EQ(std::set<uint64_t>(got.begin(), got.end()), (std::set<uint64_t>{1, 3}));
}

}  // namespace
}  // namespace kvtier
