// Deterministic tokens and payloads of the replay: what makes its byte
// verification meaningful.
#include "kvtier/tools/synthetic_kv.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvtier::tools {
namespace {

TEST(SyntheticKv, EqualBlockIdsGiveEqualTokensAndPartialBlocksArePrefixes) {
  const std::vector<uint64_t> ids{5, 9};
  const auto full = SynthesizePrompt(ids, 1024);
  const auto part = SynthesizePrompt(ids, 700);
  ASSERT_EQ(full.size(), 1024u);
  ASSERT_EQ(part.size(), 700u);
  EXPECT_TRUE(std::equal(part.begin(), part.end(), full.begin()));
  const auto other = SynthesizePrompt(std::vector<uint64_t>{5, 10}, 1024);
  EXPECT_TRUE(std::equal(full.begin(), full.begin() + 512, other.begin()));
  EXPECT_FALSE(std::equal(full.begin() + 512, full.end(), other.begin() + 512));
  for (int32_t t : full) {
    EXPECT_GE(t, 0);
    EXPECT_LT(t, 128000);
  }
}

TEST(SyntheticKv, PayloadVerifiesAndEveryFlippedByteIsCounted) {
  const ChunkKey key{0x1234, 0x5678};
  std::vector<std::byte> p(2 * 4096);
  FillPayload(key, 2, p);
  EXPECT_EQ(CountPayloadErrors(key, 2, p), 0u);
  p[3] ^= std::byte{1};
  p[4096 + 100] ^= std::byte{0x80};
  EXPECT_EQ(CountPayloadErrors(key, 2, p), 2u);
}

TEST(SyntheticKv, PayloadDependsOnKeyAndLayer) {
  std::vector<std::byte> a(2 * 1024), b(2 * 1024);
  FillPayload(ChunkKey{1, 2}, 2, a);
  FillPayload(ChunkKey{1, 3}, 2, b);
  EXPECT_NE(CountPayloadErrors(ChunkKey{1, 2}, 2, b), 0u);
  EXPECT_FALSE(std::equal(a.begin(), a.begin() + 1024, a.begin() + 1024)) << "layers differ";
}

}  // namespace
}  // namespace kvtier::tools
