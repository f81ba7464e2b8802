// The KV-event codec: byte-for-byte what vLLM's msgspec encoder makes, round trips, refusals.
#include "kvtier/kv_event.h"

#include <gtest/gtest.h>

#include <string>

namespace kvtier {
namespace {

std::string FromHex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

ChunkKey Filled(uint8_t b) {
  const uint64_t v = 0x0101010101010101ULL * b;
  return ChunkKey{v, v};
}

KvEventBatch SampleBatch() {
  KvEventBatch batch;
  batch.ts = 1.5;
  batch.data_parallel_rank = 0;
  KvEvent stored;
  stored.type = KvEventType::kBlockStored;
  stored.medium = KvMedium::kCpu;
  stored.block_hashes = {Filled(1)};
  stored.token_ids = {1, 2};
  stored.block_size = 2;
  KvEvent removed;
  removed.type = KvEventType::kBlockRemoved;
  removed.medium = KvMedium::kGpu;
  removed.block_hashes = {Filled(2)};
  KvEvent cleared;
  cleared.type = KvEventType::kAllBlocksCleared;
  batch.events = {stored, removed, cleared};
  return batch;
}

// The bytes vLLM 0.33's own encoder makes of the same batch:
//   msgspec.msgpack.encode(KVEventBatch(ts=1.5, events=[BlockStored(block_hashes=[b'\x01'*16],
//     parent_block_hash=None, token_ids=[1, 2], block_size=2, lora_id=None, medium='CPU',
//     lora_name=None), BlockRemoved(block_hashes=[b'\x02'*16], medium='GPU'),
//     AllBlocksCleared()], data_parallel_rank=0))
constexpr const char* kVllmBytes =
    "93cb3ff800000000000093de0008a474797065ab426c6f636b53746f726564ac626c6f636b5f6861736865"
    "7391c41001010101010101010101010101010101b1706172656e745f626c6f636b5f68617368c0a9746f6b"
    "656e5f696473920102aa626c6f636b5f73697a6502a76c6f72615f6964c0a66d656469756da3435055a96c"
    "6f72615f6e616d65c083a474797065ac426c6f636b52656d6f766564ac626c6f636b5f686173686573"
    "91c41002020202020202020202020202020202a66d656469756da347505581a474797065b0416c6c426c"
    "6f636b73436c656172656400";

TEST(KvEvent, EncodesExactlyAsVllmsMsgspecEncoder) {
  EXPECT_EQ(EncodeKvEventBatch(SampleBatch()), FromHex(kVllmBytes));
}

TEST(KvEvent, DecodesVllmsBytesBackToTheSameEvents) {
  auto batch = DecodeKvEventBatch(FromHex(kVllmBytes));
  ASSERT_TRUE(batch.ok()) << batch.status().ToString();
  EXPECT_EQ(batch->ts, 1.5);
  EXPECT_EQ(batch->data_parallel_rank, 0);
  ASSERT_EQ(batch->events.size(), 3u);
  const KvEvent& s = batch->events[0];
  EXPECT_EQ(s.type, KvEventType::kBlockStored);
  EXPECT_EQ(s.medium, KvMedium::kCpu);
  ASSERT_EQ(s.block_hashes.size(), 1u);
  EXPECT_EQ(s.block_hashes[0], Filled(1));
  EXPECT_FALSE(s.parent.has_value());
  EXPECT_EQ(s.token_ids, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(s.block_size, 2u);
  EXPECT_EQ(batch->events[1].type, KvEventType::kBlockRemoved);
  EXPECT_EQ(batch->events[1].medium, KvMedium::kGpu);
  EXPECT_EQ(batch->events[1].block_hashes[0], Filled(2));
  EXPECT_EQ(batch->events[2].type, KvEventType::kAllBlocksCleared);
}

TEST(KvEvent, RoundTripsParentsLargeTokenIdsAndStorage) {
  KvEventBatch batch;
  batch.ts = 1796431055.25;
  KvEvent e;
  e.medium = KvMedium::kStorage;
  e.block_hashes = {ChunkKey{0x1234, 0xfedcba9876543210ULL}};
  e.parent = ChunkKey{7, 9};
  e.token_ids = {0, 127, 128, 255, 256, 65535, 65536, 2147483647, -1};
  e.block_size = 9;
  batch.events = {e};
  auto back = DecodeKvEventBatch(EncodeKvEventBatch(batch));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_FALSE(back->data_parallel_rank.has_value());
  EXPECT_EQ(back->ts, batch.ts);
  ASSERT_EQ(back->events.size(), 1u);
  EXPECT_EQ(back->events[0].medium, KvMedium::kStorage);
  EXPECT_EQ(back->events[0].block_hashes, e.block_hashes);
  EXPECT_EQ(back->events[0].parent, e.parent);
  EXPECT_EQ(back->events[0].token_ids, e.token_ids);
}

TEST(KvEvent, RejectsWhatIsNotABatch) {
  EXPECT_FALSE(DecodeKvEventBatch("").ok());
  EXPECT_FALSE(DecodeKvEventBatch(FromHex("c3")).ok());  // true
  // [1.5, [{"type": "Nope"}]]
  EXPECT_FALSE(DecodeKvEventBatch(FromHex("92cb3ff80000000000009181a474797065a44e6f7065")).ok());
  // a 2-byte hash: [1.5, [{"type": "BlockRemoved", "block_hashes": [b'ab'], "medium": "CPU"}]]
  KvEventBatch b;
  KvEvent r;
  r.type = KvEventType::kBlockRemoved;
  r.block_hashes = {ChunkKey{}};
  b.events = {r};
  std::string bytes = EncodeKvEventBatch(b);
  const std::string bin16 = FromHex("c410") + std::string(16, '\0');
  bytes.replace(bytes.find(bin16), bin16.size(), FromHex("c4026162"));
  auto bad = DecodeKvEventBatch(bytes);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("16 bytes"), std::string::npos);
}

TEST(KvEvent, SequenceIsEightBytesBigEndian) {
  EXPECT_EQ(KvEventSequenceBytes(0x0102030405060708ULL), FromHex("0102030405060708"));
  EXPECT_EQ(KvEventSequenceFrom(FromHex("0102030405060708")), 0x0102030405060708ULL);
  EXPECT_EQ(KvEventSequenceBytes(kKvEventReplayEnd), std::string(8, '\xff'));
  EXPECT_FALSE(KvEventSequenceFrom("1234567").has_value());
}

}  // namespace
}  // namespace kvtier
