// Slot image: the on-arena and on-disk form of one stored chunk (DESIGN.md).
//
// Layout of one slot (all integers little-endian):
//   [0, header_bytes)                 SlotHeader (104 B), then num_tokens int32 token ids,
//                                     zero padding up to header_bytes (a 256 B multiple)
//   [header_bytes, +payload_bytes)    chunk payload, layer-major
//   [.., slot_bytes)                  zero padding up to a 4 KiB multiple
// The same image lives in a DRAM slot and an NVMe slot, so moving a chunk
// between tiers is one copy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "kvtier/chunk_key.h"
#include "kvtier/namespace_spec.h"
#include "kvtier/status.h"

namespace kvtier {

inline constexpr uint64_t kSlotMagic = 0x31544F4C5354564BULL;  // "KVTSLOT1"
inline constexpr uint32_t kSlotFormatVersion = 1;
inline constexpr uint64_t kSlotAlignment = 4096;    // slot_bytes is a multiple of this
inline constexpr uint64_t kPayloadAlignment = 256;  // header_bytes is a multiple of this

// Fixed part of the header; the token ids follow it.
struct SlotHeader {
  uint64_t magic;           // kSlotMagic
  uint32_t format_version;  // kSlotFormatVersion
  uint32_t header_bytes;    // offset of the payload in the slot
  std::byte namespace_digest[16];
  std::byte key[16];
  std::byte parent_key[16];  // previous chunk's key, or the namespace digest for chunk 0
  uint64_t sequence;         // daemon-wide commit sequence number
  uint64_t payload_bytes;
  uint64_t payload_checksum;  // XXH3-64 of the payload bytes
  uint32_t num_tokens;        // == chunk_tokens
  uint32_t flags;             // kSlotFlag* bits
  uint32_t reserved;          // 0
  uint32_t header_checksum;   // low 32 bits of XXH3-64 over the header and tokens, this field 0
};
static_assert(sizeof(SlotHeader) == 104);

// payload_checksum is not computed yet (a DRAM-only chunk); SealPayloadChecksum
// computes it before the image leaves DRAM.
inline constexpr uint32_t kSlotFlagPayloadChecksumPending = 1;

// Sizes of the slot image of one namespace.
struct SlotLayout {
  uint32_t chunk_tokens = 0;
  uint32_t header_bytes = 0;   // AlignUp(104 + 4 * chunk_tokens, 256)
  uint64_t payload_bytes = 0;  // NamespaceSpec::PayloadBytes()
  uint64_t slot_bytes = 0;     // AlignUp(header_bytes + payload_bytes, 4096)

  // REQUIRES: spec.Validate() is OK.
  static SlotLayout For(const NamespaceSpec& spec);
};

// What a slot must hold to be served for one lookup.
struct SlotIdentity {
  NamespaceId ns;
  ChunkKey key;
  ChunkKey parent;
  std::span<const int32_t> tokens;  // exactly chunk_tokens ids
};

// Writes the header of the slot at `slot` and its header checksum. With
// `with_payload_checksum` it also checksums the payload already written there;
// without, it marks the checksum pending (kSlotFlagPayloadChecksumPending).
// REQUIRES: `slot` spans layout.slot_bytes; id.tokens.size() == layout.chunk_tokens.
void SealSlot(std::byte* slot, const SlotLayout& layout, const SlotIdentity& id, uint64_t sequence,
              bool with_payload_checksum = true);

// Computes a pending payload checksum and clears the pending flag (no-op when
// already computed). REQUIRES: the header was written by SealSlot.
void SealPayloadChecksum(std::byte* slot, const SlotLayout& layout);

// Checks the header against `id` (magic, version, sizes, namespace, key, parent,
// token ids, and with `check_header_checksum` the header checksum): the token
// check. Does not read the payload. DRAM lookups skip the header checksum (the
// daemon wrote that header itself); reads from disk check it.
// Errors: DATA_LOSS naming the first mismatching field.
Status VerifySlotHeader(const std::byte* slot, const SlotLayout& layout, const SlotIdentity& id,
                        bool check_header_checksum = true);

// Seqlock-style guard for readers whose lease may have lapsed mid-copy:
// InvalidateSlot clears magic and sequence before a slot is handed to a new
// writer (then a release fence); a reader copies the payload, then (after an
// acquire fence, done here) checks that SlotSequence still returns the sequence
// it was given at lookup. A nonzero match means the copy saw the leased bytes.
// REQUIRES: `slot` is 8-byte aligned (slots are 4 KiB aligned).
void InvalidateSlot(std::byte* slot);
// The header's sequence when the magic is valid, else 0. Reads with an acquire
// fence first, so a payload copied before the call is covered.
uint64_t SlotSequence(const std::byte* slot);

// Gives the sealed image at `slot` a new sequence (and header checksum): an
// image promoted from the remote tier, written by another daemon, gets one of
// this daemon's. REQUIRES: the header was written by SealSlot.
void RestampSlotSequence(std::byte* slot, const SlotLayout& layout, uint64_t sequence);

// Checks the payload checksum stored in the header. Errors: DATA_LOSS, also
// when the checksum is still pending.
Status VerifySlotPayload(const std::byte* slot, const SlotLayout& layout);

}  // namespace kvtier
