// Slot image: SealSlot / VerifySlotHeader / VerifySlotPayload, each corruption
// DATA_LOSS naming what differs, and SlotLayout sizes.
#include "kvtier/slot_image.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "common/status_printer.h"
#include "kvtier/units.h"

namespace kvtier {
namespace {

NamespaceSpec Tiny() {
  NamespaceSpec s;
  s.model_id = "test-model";
  s.num_layers = 2;
  s.num_kv_heads = 1;
  s.head_dim = 64;
  s.chunk_tokens = 4;
  return s;
}

class SlotImageTest : public ::testing::Test {
 protected:
  SlotImageTest()
      : layout_(SlotLayout::For(Tiny())),
        ns_(Tiny().Digest()),
        tokens_{10, 11, 12, 13},
        parent_(ns_),
        key_(ComputeChunkKey(parent_, tokens_)),
        slot_(NewSlot(0x5A)) {}

  std::vector<std::byte> NewSlot(uint8_t fill) const {
    std::vector<std::byte> s(layout_.slot_bytes, std::byte{0xEE});
    for (uint64_t i = 0; i < layout_.payload_bytes; ++i) {
      s[layout_.header_bytes + i] = std::byte(static_cast<uint8_t>(fill + i * 31));
    }
    return s;
  }
  SlotIdentity Id() const { return {ns_, key_, parent_, tokens_}; }
  void Seal(std::vector<std::byte>& slot, uint64_t seq = 7) const {
    SealSlot(slot.data(), layout_, Id(), seq);
  }
  Status Header(const SlotIdentity& id) const {
    return VerifySlotHeader(slot_.data(), layout_, id);
  }
  static void ExpectDataLoss(const Status& st, const char* names) {
    EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st.ToString();
    EXPECT_NE(st.message().find(names), std::string::npos) << st.message();
  }

  const SlotLayout layout_;
  const NamespaceId ns_;
  const std::vector<int32_t> tokens_;
  const ChunkKey parent_;
  const ChunkKey key_;
  std::vector<std::byte> slot_;
};

TEST_F(SlotImageTest, SealedSlotVerifies) {
  Seal(slot_);
  EXPECT_TRUE(Header(Id()).ok()) << Header(Id()).ToString();
  EXPECT_TRUE(VerifySlotPayload(slot_.data(), layout_).ok());
}

TEST_F(SlotImageTest, HeaderHoldsMagicTokensAndZeroPadding) {
  Seal(slot_, 42);
  SlotHeader h;
  std::memcpy(&h, slot_.data(), sizeof(h));
  EXPECT_EQ(h.magic, kSlotMagic);
  EXPECT_EQ(h.format_version, kSlotFormatVersion);
  EXPECT_EQ(h.header_bytes, layout_.header_bytes);
  EXPECT_EQ(h.sequence, 42u);
  EXPECT_EQ(h.payload_bytes, layout_.payload_bytes);
  EXPECT_EQ(h.num_tokens, 4u);
  EXPECT_EQ(ChunkKey::FromBytes(h.key), key_);
  EXPECT_EQ(std::memcmp(slot_.data() + sizeof(SlotHeader), tokens_.data(), 16), 0);
  for (size_t i = sizeof(SlotHeader) + 16; i < layout_.header_bytes; ++i) {
    ASSERT_EQ(slot_[i], std::byte{0}) << "padding byte " << i;
  }
}

TEST_F(SlotImageTest, BadMagicIsDataLoss) {
  Seal(slot_);
  slot_[0] ^= std::byte{1};
  ExpectDataLoss(Header(Id()), "magic");
}

TEST_F(SlotImageTest, WrongFormatVersionIsDataLoss) {
  Seal(slot_);
  const uint32_t v2 = 2;
  std::memcpy(slot_.data() + offsetof(SlotHeader, format_version), &v2, 4);
  ExpectDataLoss(Header(Id()), "format_version");
}

TEST_F(SlotImageTest, WrongNamespaceIsDataLoss) {
  Seal(slot_);
  NamespaceSpec other = Tiny();
  other.cache_salt = "tenant-b";
  SlotIdentity id = Id();
  id.ns = other.Digest();
  ExpectDataLoss(Header(id), "namespace");
}

TEST_F(SlotImageTest, WrongKeyIsDataLoss) {
  Seal(slot_);
  SlotIdentity id = Id();
  id.key.lo ^= 1;
  ExpectDataLoss(Header(id), "key");
}

TEST_F(SlotImageTest, WrongParentIsDataLoss) {
  Seal(slot_);
  SlotIdentity id = Id();
  id.parent.hi ^= 1ULL << 63;
  ExpectDataLoss(Header(id), "parent");
}

TEST_F(SlotImageTest, OneDifferentTokenIsDataLoss) {
  Seal(slot_);
  for (size_t i = 0; i < tokens_.size(); ++i) {
    std::vector<int32_t> other = tokens_;
    other[i] += 1;
    SlotIdentity id = Id();
    id.tokens = other;
    SCOPED_TRACE(i);
    ExpectDataLoss(Header(id), "token");
  }
}

TEST_F(SlotImageTest, WrongTokenCountIsDataLoss) {
  Seal(slot_);
  SlotIdentity id = Id();
  id.tokens = std::span(tokens_).first(3);
  EXPECT_EQ(Header(id).code(), StatusCode::kDataLoss);
}

TEST_F(SlotImageTest, WrongPayloadLengthIsDataLoss) {
  Seal(slot_);
  const uint64_t longer = layout_.payload_bytes + 256;
  std::memcpy(slot_.data() + offsetof(SlotHeader, payload_bytes), &longer, 8);
  ExpectDataLoss(Header(Id()), "payload_bytes");
  ExpectDataLoss(VerifySlotPayload(slot_.data(), layout_), "payload_bytes");
}

TEST_F(SlotImageTest, LayoutOfAnotherNamespaceIsDataLoss) {
  Seal(slot_);
  SlotLayout other = layout_;
  other.payload_bytes -= 512;
  EXPECT_EQ(VerifySlotHeader(slot_.data(), other, Id()).code(), StatusCode::kDataLoss);
  EXPECT_EQ(VerifySlotPayload(slot_.data(), other).code(), StatusCode::kDataLoss);
}

TEST_F(SlotImageTest, FlippedPayloadByteFailsChecksum) {
  Seal(slot_);
  slot_[layout_.header_bytes + layout_.payload_bytes - 1] ^= std::byte{0x80};
  EXPECT_TRUE(Header(Id()).ok());  // the header alone cannot see it
  ExpectDataLoss(VerifySlotPayload(slot_.data(), layout_), "checksum");
}

TEST_F(SlotImageTest, TornWriteHeaderAndPayloadOfDifferentSealsFails) {
  std::vector<std::byte> a = NewSlot(0x01);
  std::vector<std::byte> b = NewSlot(0x02);
  Seal(a, 1);
  Seal(b, 2);
  // Header (and tokens) from seal a, payload from seal b.
  std::memcpy(a.data() + layout_.header_bytes, b.data() + layout_.header_bytes,
              layout_.payload_bytes);
  EXPECT_TRUE(VerifySlotHeader(a.data(), layout_, Id()).ok());
  ExpectDataLoss(VerifySlotPayload(a.data(), layout_), "checksum");
}

TEST_F(SlotImageTest, FlippedHeaderByteFailsHeaderChecksum) {
  Seal(slot_);
  slot_[offsetof(SlotHeader, sequence)] ^= std::byte{0x04};  // no field check covers it
  ExpectDataLoss(Header(Id()), "checksum");
  Seal(slot_);
  slot_[offsetof(SlotHeader, payload_checksum) + 3] ^= std::byte{0x10};
  ExpectDataLoss(Header(Id()), "checksum");
}

TEST_F(SlotImageTest, ResealingWithNewPayloadVerifiesAgain) {
  Seal(slot_, 1);
  slot_[layout_.header_bytes] ^= std::byte{0xFF};
  ASSERT_FALSE(VerifySlotPayload(slot_.data(), layout_).ok());
  Seal(slot_, 2);
  EXPECT_TRUE(VerifySlotPayload(slot_.data(), layout_).ok());
}

TEST(SlotLayout, TinyLayoutSizes) {
  const SlotLayout l = SlotLayout::For(Tiny());
  EXPECT_EQ(l.chunk_tokens, 4u);
  EXPECT_EQ(l.header_bytes, 256u);  // 96 + 16 rounded up
  EXPECT_EQ(l.payload_bytes, 2048u);
  EXPECT_EQ(l.slot_bytes, 4096u);
}

TEST(SlotLayout, Llama3LayoutSizes) {
  NamespaceSpec s;
  s.model_id = "meta-llama/Llama-3.1-8B";
  s.num_layers = 32;
  s.num_kv_heads = 8;
  s.head_dim = 128;
  const SlotLayout l = SlotLayout::For(s);
  EXPECT_EQ(l.header_bytes, 1280u);  // 96 + 1024 rounded up
  EXPECT_EQ(l.payload_bytes, 32 * kMiB);
  EXPECT_EQ(l.slot_bytes, 32 * kMiB + 4096);
}

TEST(SlotLayout, HeaderIs256AndSlotIs4096AlignedForAnyChunkSize) {
  for (uint32_t c : {1u, 3u, 4u, 40u, 41u, 100u, 256u, 1000u, 4096u}) {
    NamespaceSpec s = Tiny();
    s.chunk_tokens = c;
    const SlotLayout l = SlotLayout::For(s);
    SCOPED_TRACE(c);
    EXPECT_EQ(l.header_bytes % kPayloadAlignment, 0u);
    EXPECT_GE(l.header_bytes, sizeof(SlotHeader) + 4 * c);
    EXPECT_LT(l.header_bytes, sizeof(SlotHeader) + 4 * c + kPayloadAlignment);
    EXPECT_EQ(l.slot_bytes % kSlotAlignment, 0u);
    EXPECT_GE(l.slot_bytes, l.header_bytes + l.payload_bytes);
    EXPECT_LT(l.slot_bytes, l.header_bytes + l.payload_bytes + kSlotAlignment);
  }
}

TEST_F(SlotImageTest, PendingPayloadChecksumFailsUntilSealed) {
  SealSlot(slot_.data(), layout_, Id(), 7, /*with_payload_checksum=*/false);
  EXPECT_TRUE(Header(Id()).ok());
  ExpectDataLoss(VerifySlotPayload(slot_.data(), layout_), "pending");
  SealPayloadChecksum(slot_.data(), layout_);
  EXPECT_TRUE(Header(Id()).ok());
  EXPECT_TRUE(VerifySlotPayload(slot_.data(), layout_).ok());
}

TEST_F(SlotImageTest, LateChecksumCoversPayloadWrittenBeforeSealing) {
  SealSlot(slot_.data(), layout_, Id(), 7, /*with_payload_checksum=*/false);
  SealPayloadChecksum(slot_.data(), layout_);
  slot_[layout_.header_bytes + 3] ^= std::byte{0x40};
  ExpectDataLoss(VerifySlotPayload(slot_.data(), layout_), "checksum");
}

}  // namespace
}  // namespace kvtier
