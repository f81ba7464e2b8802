// Fuzz target: slot header verification (kvtier/slot_image.h): VerifySlotHeader, the token
// check every lookup and NVMe read relies on, and VerifySlotPayload.
//
// Input (FuzzedDataProvider): a slot layout (1..64 tokens, 1 B..16 KiB of payload), the
// identity a reader expects (namespace, key, parent, token ids), then either
//   - raw: the slot's bytes as they come (a slot never sealed: garbage, a torn write), or
//   - sealed: a slot SealSlot wrote for that identity, then up to 16 byte edits.
// The slot buffer is exactly slot_bytes long, so a read past it is an ASan report.
// Checks:
//   - a header that verifies holds exactly the expected identity and the layout's sizes;
//   - with the header checksum it verifies only if it also does without;
//   - a sealed slot with no edit in its header's checksummed bytes verifies, and one with an
//     edit there fails (the edit changes a byte the checksum covers);
//   - the payload verifies iff no payload byte changed (and the checksum is not pending);
//   - SealPayloadChecksum makes a pending checksum verify; InvalidateSlot makes the sequence
//     read 0 and the header fail.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "fuzz_check.h"
#include "kvtier/slot_image.h"
#include "kvtier/units.h"

namespace {

using kvtier::ChunkKey;
using kvtier::SlotHeader;
using kvtier::SlotIdentity;
using kvtier::SlotLayout;

ChunkKey ConsumeKey(FuzzedDataProvider& in) {
  ChunkKey k;
  k.lo = in.ConsumeIntegral<uint64_t>();
  k.hi = in.ConsumeIntegral<uint64_t>();
  return k;
}

struct AlignedFree {
  void operator()(std::byte* p) const { std::free(p); }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  SlotLayout layout;
  layout.chunk_tokens = in.ConsumeIntegralInRange<uint32_t>(1, 64);
  layout.header_bytes = static_cast<uint32_t>(
      kvtier::AlignUp(sizeof(SlotHeader) + 4ULL * layout.chunk_tokens, kvtier::kPayloadAlignment));
  layout.payload_bytes = in.ConsumeIntegralInRange<uint64_t>(1, 16384);
  layout.slot_bytes =
      kvtier::AlignUp(layout.header_bytes + layout.payload_bytes, kvtier::kSlotAlignment);
  std::vector<int32_t> tokens(layout.chunk_tokens);
  for (int32_t& t : tokens) t = in.ConsumeIntegral<int32_t>();
  const SlotIdentity id{ConsumeKey(in), ConsumeKey(in), ConsumeKey(in), tokens};
  const bool sealed = in.ConsumeBool();
  const bool payload_checksum = in.ConsumeBool();
  const uint64_t sequence = in.ConsumeIntegral<uint64_t>();

  // Exactly slot_bytes (a multiple of 4 KiB, as InvalidateSlot's alignment needs).
  std::unique_ptr<std::byte, AlignedFree> owner(
      static_cast<std::byte*>(std::aligned_alloc(kvtier::kSlotAlignment, layout.slot_bytes)));
  std::byte* slot = owner.get();
  std::memset(slot, 0, layout.slot_bytes);

  // The bytes the header checksum covers: the fixed header and the token ids.
  const size_t covered = sizeof(SlotHeader) + 4ULL * layout.chunk_tokens;
  bool header_edited = false, payload_edited = false;
  if (!sealed) {
    const std::vector<uint8_t> raw = in.ConsumeBytes<uint8_t>(layout.slot_bytes);
    if (!raw.empty()) std::memcpy(slot, raw.data(), raw.size());
  } else {
    const std::vector<uint8_t> payload = in.ConsumeBytes<uint8_t>(layout.payload_bytes);
    if (!payload.empty()) std::memcpy(slot + layout.header_bytes, payload.data(), payload.size());
    kvtier::SealSlot(slot, layout, id, sequence, payload_checksum);
    std::vector<uint8_t> before(reinterpret_cast<const uint8_t*>(slot),
                                reinterpret_cast<const uint8_t*>(slot) + layout.slot_bytes);
    const int edits = in.ConsumeIntegralInRange(0, 16);
    for (int e = 0; e < edits; ++e) {
      const size_t at = in.ConsumeIntegralInRange<size_t>(0, layout.slot_bytes - 1);
      slot[at] ^= std::byte{in.ConsumeIntegral<uint8_t>()};
    }
    for (size_t at = 0; at < layout.slot_bytes; ++at) {
      if (static_cast<uint8_t>(slot[at]) == before[at]) continue;
      if (at < covered) header_edited = true;
      if (at >= layout.header_bytes && at < layout.header_bytes + layout.payload_bytes) {
        payload_edited = true;
      }
    }
  }

  const kvtier::Status checked = kvtier::VerifySlotHeader(slot, layout, id, true);
  const kvtier::Status unchecked = kvtier::VerifySlotHeader(slot, layout, id, false);
  FUZZ_CHECK(checked.ok() || checked.code() == kvtier::StatusCode::kDataLoss,
             "a header that fails is not DATA_LOSS");
  FUZZ_CHECK(!checked.ok() || unchecked.ok(), "verifies with the checksum but not without");
  if (unchecked.ok()) {
    SlotHeader h;
    std::memcpy(&h, slot, sizeof(h));
    FUZZ_CHECK(h.magic == kvtier::kSlotMagic && h.format_version == kvtier::kSlotFormatVersion,
               "a verified header has a bad magic or version");
    FUZZ_CHECK(h.header_bytes == layout.header_bytes && h.num_tokens == layout.chunk_tokens &&
                   h.payload_bytes == layout.payload_bytes,
               "a verified header has other sizes than the layout");
    FUZZ_CHECK(ChunkKey::FromBytes(h.namespace_digest) == id.ns &&
                   ChunkKey::FromBytes(h.key) == id.key &&
                   ChunkKey::FromBytes(h.parent_key) == id.parent,
               "a verified header names another namespace, key or parent");
    FUZZ_CHECK(std::memcmp(slot + sizeof(SlotHeader), tokens.data(), 4 * tokens.size()) == 0,
               "a verified header holds other token ids");
  }
  if (!sealed) return 0;

  FUZZ_CHECK(checked.ok() == !header_edited,
             "an edit of the checksummed header bytes and the verdict disagree");
  const kvtier::Status payload = kvtier::VerifySlotPayload(slot, layout);
  if (!header_edited) {
    FUZZ_CHECK(payload.ok() == (payload_checksum && !payload_edited),
               "the payload verdict does not match the edits");
    if (!payload_checksum && !payload_edited) {
      kvtier::SealPayloadChecksum(slot, layout);
      FUZZ_CHECK(kvtier::VerifySlotPayload(slot, layout).ok(),
                 "a payload checksum sealed late does not verify");
      FUZZ_CHECK(kvtier::VerifySlotHeader(slot, layout, id, true).ok(),
                 "sealing the payload checksum broke the header");
    }
    FUZZ_CHECK(kvtier::SlotSequence(slot) == sequence, "the sequence read back differs");
  }
  kvtier::InvalidateSlot(slot);
  FUZZ_CHECK(kvtier::SlotSequence(slot) == 0, "an invalidated slot still has a sequence");
  FUZZ_CHECK(!kvtier::VerifySlotHeader(slot, layout, id, false).ok(),
             "an invalidated slot still verifies");
  return 0;
}
