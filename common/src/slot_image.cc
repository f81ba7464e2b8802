#include "kvtier/slot_image.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t for streaming hashes
#include <xxhash.h>
#if defined(__x86_64__)
// libxxhash's run-time dispatch (AVX-512 or AVX2 where the CPU has them): a 1 MiB payload
// checksum in about a third of the SSE2 path's time.
#include <xxh_x86dispatch.h>
#endif

#include <atomic>
#include <cstring>

#include "kvtier/units.h"

namespace kvtier {
namespace {

uint32_t HeaderChecksum(const std::byte* slot, uint32_t num_tokens) {
  SlotHeader h;
  std::memcpy(&h, slot, sizeof(h));
  h.header_checksum = 0;
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  XXH3_64bits_update(&state, &h, sizeof(h));
  XXH3_64bits_update(&state, slot + sizeof(SlotHeader), uint64_t{num_tokens} * 4);
  return static_cast<uint32_t>(XXH3_64bits_digest(&state));
}

}  // namespace

SlotLayout SlotLayout::For(const NamespaceSpec& spec) {
  SlotLayout l;
  l.chunk_tokens = spec.chunk_tokens;
  l.header_bytes = static_cast<uint32_t>(
      AlignUp(sizeof(SlotHeader) + uint64_t{4} * spec.chunk_tokens, kPayloadAlignment));
  l.payload_bytes = spec.PayloadBytes();
  l.slot_bytes = AlignUp(l.header_bytes + l.payload_bytes, kSlotAlignment);
  return l;
}

void SealSlot(std::byte* slot, const SlotLayout& layout, const SlotIdentity& id, uint64_t sequence,
              bool with_payload_checksum) {
  SlotHeader h{};
  h.magic = kSlotMagic;
  h.format_version = kSlotFormatVersion;
  h.header_bytes = layout.header_bytes;
  id.ns.ToBytes(h.namespace_digest);
  id.key.ToBytes(h.key);
  id.parent.ToBytes(h.parent_key);
  h.sequence = sequence;
  h.payload_bytes = layout.payload_bytes;
  h.payload_checksum =
      with_payload_checksum ? XXH3_64bits(slot + layout.header_bytes, layout.payload_bytes) : 0;
  h.flags = with_payload_checksum ? 0 : kSlotFlagPayloadChecksumPending;
  h.num_tokens = layout.chunk_tokens;
  h.header_checksum = 0;
  std::memcpy(slot, &h, sizeof(h));
  std::memcpy(slot + sizeof(SlotHeader), id.tokens.data(), id.tokens.size_bytes());
  const size_t used = sizeof(SlotHeader) + id.tokens.size_bytes();
  std::memset(slot + used, 0, layout.header_bytes - used);
  const uint32_t checksum = HeaderChecksum(slot, layout.chunk_tokens);
  std::memcpy(slot + offsetof(SlotHeader, header_checksum), &checksum, sizeof(checksum));
}

Status VerifySlotHeader(const std::byte* slot, const SlotLayout& layout, const SlotIdentity& id,
                        bool check_header_checksum) {
  SlotHeader h;
  std::memcpy(&h, slot, sizeof(h));
  if (h.magic != kSlotMagic) return Status::DataLoss("slot header: bad magic");
  if (h.format_version != kSlotFormatVersion) {
    return Status::DataLoss("slot header: format_version " + std::to_string(h.format_version) +
                            " is not " + std::to_string(kSlotFormatVersion));
  }
  if (h.header_bytes != layout.header_bytes || h.num_tokens != layout.chunk_tokens) {
    return Status::DataLoss("slot header: header_bytes or num_tokens do not match the namespace");
  }
  if (h.payload_bytes != layout.payload_bytes) {
    return Status::DataLoss("slot header: payload_bytes does not match the namespace");
  }
  if (ChunkKey::FromBytes(h.namespace_digest) != id.ns) {
    return Status::DataLoss("slot header: namespace digest differs");
  }
  if (ChunkKey::FromBytes(h.key) != id.key) return Status::DataLoss("slot header: key differs");
  if (ChunkKey::FromBytes(h.parent_key) != id.parent) {
    return Status::DataLoss("slot header: parent key differs");
  }
  if (id.tokens.size() != layout.chunk_tokens ||
      std::memcmp(slot + sizeof(SlotHeader), id.tokens.data(), id.tokens.size_bytes()) != 0) {
    return Status::DataLoss("slot header: token ids differ");
  }
  if (check_header_checksum && HeaderChecksum(slot, layout.chunk_tokens) != h.header_checksum) {
    return Status::DataLoss("slot header: header checksum mismatch");
  }
  return Status::Ok();
}

void InvalidateSlot(std::byte* slot) {
  auto* magic = reinterpret_cast<uint64_t*>(slot + offsetof(SlotHeader, magic));
  auto* sequence = reinterpret_cast<uint64_t*>(slot + offsetof(SlotHeader, sequence));
  std::atomic_ref<uint64_t>(*magic).store(0, std::memory_order_relaxed);
  std::atomic_ref<uint64_t>(*sequence).store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
}

uint64_t SlotSequence(const std::byte* slot) {
  std::atomic_thread_fence(std::memory_order_acquire);
  auto* magic =
      reinterpret_cast<uint64_t*>(const_cast<std::byte*>(slot) + offsetof(SlotHeader, magic));
  auto* sequence =
      reinterpret_cast<uint64_t*>(const_cast<std::byte*>(slot) + offsetof(SlotHeader, sequence));
  if (std::atomic_ref<uint64_t>(*magic).load(std::memory_order_relaxed) != kSlotMagic) return 0;
  return std::atomic_ref<uint64_t>(*sequence).load(std::memory_order_relaxed);
}

void SealPayloadChecksum(std::byte* slot, const SlotLayout& layout) {
  SlotHeader h;
  std::memcpy(&h, slot, sizeof(h));
  if ((h.flags & kSlotFlagPayloadChecksumPending) == 0) return;
  h.payload_checksum = XXH3_64bits(slot + layout.header_bytes, layout.payload_bytes);
  h.flags &= ~kSlotFlagPayloadChecksumPending;
  std::memcpy(slot, &h, sizeof(h));
  const uint32_t checksum = HeaderChecksum(slot, layout.chunk_tokens);
  std::memcpy(slot + offsetof(SlotHeader, header_checksum), &checksum, sizeof(checksum));
}

void RestampSlotSequence(std::byte* slot, const SlotLayout& layout, uint64_t sequence) {
  std::memcpy(slot + offsetof(SlotHeader, sequence), &sequence, sizeof(sequence));
  const uint32_t checksum = HeaderChecksum(slot, layout.chunk_tokens);
  std::memcpy(slot + offsetof(SlotHeader, header_checksum), &checksum, sizeof(checksum));
}

Status VerifySlotPayload(const std::byte* slot, const SlotLayout& layout) {
  SlotHeader h;
  std::memcpy(&h, slot, sizeof(h));
  if ((h.flags & kSlotFlagPayloadChecksumPending) != 0) {
    return Status::DataLoss("slot payload: checksum is still pending");
  }
  if (h.payload_bytes != layout.payload_bytes) {
    return Status::DataLoss("slot header: payload_bytes does not match the namespace");
  }
  if (XXH3_64bits(slot + layout.header_bytes, layout.payload_bytes) != h.payload_checksum) {
    return Status::DataLoss("slot payload: checksum mismatch");
  }
  return Status::Ok();
}

}  // namespace kvtier
