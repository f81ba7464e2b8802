// ChunkIndex: its open-addressed key table against a std::map, and
// SubtreesDeepestFirst: the chunks picked plus all their descendants, each
// child before its parent (the order of a leaf-first removal).
#include "kvtier/tiers/chunk_index.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

namespace kvtier {
namespace {

ChunkKey K(uint64_t n) { return ChunkKey{n, 0}; }
constexpr uint64_t kRoot = 1000;  // the namespace id: parent of first chunks, never an entry

// Inserts and erases at random, many keys sharing a home position (their low
// bits: long probe runs that wrap around the table's end, so erases shift
// handles back across it), and checks every key against a std::map after each
// step: found with its own entry, or absent; ForEach lists each live handle once.
TEST(ChunkIndexTest, FindAgreesWithAMapThroughInsertsErasesAndGrowth) {
  ChunkIndex index;
  std::map<std::pair<uint64_t, uint64_t>, uint32_t> model;  // (lo, hi) -> handle
  std::mt19937_64 rng(7);
  std::vector<ChunkKey> keys;
  for (uint64_t i = 0; i < 600; ++i) {
    // Low bits from 40 values (shared homes), and near the top of a 16- to
    // 1024-position table (runs that wrap); hi tells the keys apart.
    keys.push_back(ChunkKey{(rng() % 40) | ((rng() % 2) ? 0 : 0x3F0), i + 1});
  }
  for (int step = 0; step < 6000; ++step) {
    const ChunkKey& k = keys[rng() % keys.size()];
    const auto it = model.find({k.lo, k.hi});
    if (it == model.end()) {
      ChunkEntry e;
      e.key = k;
      e.slot_offset = k.hi * 4096;
      model[{k.lo, k.hi}] = index.Insert(e);
    } else if (rng() % 3 != 0) {  // erase more often than not once present
      index.Erase(it->second);
      model.erase(it);
    }
    if (step % 97 != 0 && step < 5900) continue;
    ASSERT_EQ(index.size(), model.size()) << "step " << step;
    for (const ChunkKey& q : keys) {
      const uint32_t h = index.Find(q);
      const auto m = model.find({q.lo, q.hi});
      if (m == model.end()) {
        ASSERT_EQ(h, ChunkIndex::kNone) << "step " << step << ": an erased key is found";
      } else {
        ASSERT_EQ(h, m->second) << "step " << step << ": key " << q.hi << " lost";
        ASSERT_EQ(index.Get(h).slot_offset, q.hi * 4096);
      }
    }
    std::set<uint32_t> listed;
    index.ForEach([&](uint32_t h) { EXPECT_TRUE(listed.insert(h).second) << "listed twice"; });
    ASSERT_EQ(listed.size(), model.size());
  }
}

TEST(ChunkIndexTest, ReserveKeepsWhatIsThere) {
  ChunkIndex index;
  std::vector<uint32_t> handles;
  for (uint64_t i = 0; i < 100; ++i) {
    ChunkEntry e;
    e.key = ChunkKey{i * 0x9E3779B97F4A7C15ULL, i};
    handles.push_back(index.Insert(e));
  }
  index.Reserve(100000);
  for (uint64_t i = 0; i < 100; ++i) {
    EXPECT_EQ(index.Find(ChunkKey{i * 0x9E3779B97F4A7C15ULL, i}), handles[i]);
  }
  EXPECT_EQ(index.Find(ChunkKey{1, 1000}), ChunkIndex::kNone);
}

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
