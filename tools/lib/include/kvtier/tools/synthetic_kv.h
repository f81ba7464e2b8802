// Deterministic tokens and KV payloads for replaying traces with real bytes.
//
// Tokens: block id b of a Mooncake trace stands for 512 fixed tokens, so equal
// ids mean equal prefixes; a partial last block is a prefix of its 512 tokens.
// Payloads: every byte is a function of (chunk key, layer, offset), so a loaded
// chunk can be checked against what must have been stored under its key.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvtier/chunk_key.h"

namespace kvtier::tools {

inline constexpr uint32_t kTraceBlockTokens = 512;  // Mooncake trace block size

// Token j (0..511) of block `block_id`: in [0, 128000), like a real vocabulary.
int32_t BlockToken(uint64_t block_id, uint32_t j);

// The prompt of a request: blocks in order, `input_length` tokens in all.
std::vector<int32_t> SynthesizePrompt(std::span<const uint64_t> block_ids, uint64_t input_length);

// Fills `payload` (one chunk, `num_layers` equal layers, 8-byte multiple per
// layer) with the pattern of `key`.
void FillPayload(const ChunkKey& key, uint32_t num_layers, std::span<std::byte> payload);

// Number of bytes of `payload` that differ from the pattern of `key` (0 = OK).
uint64_t CountPayloadErrors(const ChunkKey& key, uint32_t num_layers,
                            std::span<const std::byte> payload);

}  // namespace kvtier::tools
