#include "kvtier/tools/synthetic_kv.h"

#include <cstring>

namespace kvtier::tools {
namespace {

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

inline uint64_t LayerSeed(const ChunkKey& key, uint32_t layer) {
  return SplitMix64(key.lo ^ SplitMix64(key.hi ^ (uint64_t{layer} << 40)));
}

}  // namespace

int32_t BlockToken(uint64_t block_id, uint32_t j) {
  return static_cast<int32_t>(SplitMix64(block_id * kTraceBlockTokens + j) % 128000);
}

std::vector<int32_t> SynthesizePrompt(std::span<const uint64_t> block_ids, uint64_t input_length) {
  std::vector<int32_t> tokens;
  tokens.reserve(input_length);
  for (uint64_t b : block_ids) {
    for (uint32_t j = 0; j < kTraceBlockTokens && tokens.size() < input_length; ++j) {
      tokens.push_back(BlockToken(b, j));
    }
  }
  return tokens;
}

void FillPayload(const ChunkKey& key, uint32_t num_layers, std::span<std::byte> payload) {
  const size_t layer_bytes = payload.size() / num_layers;
  for (uint32_t l = 0; l < num_layers; ++l) {
    const uint64_t seed = LayerSeed(key, l);
    std::byte* p = payload.data() + l * layer_bytes;
    for (size_t w = 0; w < layer_bytes / 8; ++w) {
      const uint64_t v = SplitMix64(seed + w);
      std::memcpy(p + w * 8, &v, 8);
    }
  }
}

uint64_t CountPayloadErrors(const ChunkKey& key, uint32_t num_layers,
                            std::span<const std::byte> payload) {
  const size_t layer_bytes = payload.size() / num_layers;
  uint64_t errors = 0;
  for (uint32_t l = 0; l < num_layers; ++l) {
    const uint64_t seed = LayerSeed(key, l);
    const std::byte* p = payload.data() + l * layer_bytes;
    for (size_t w = 0; w < layer_bytes / 8; ++w) {
      const uint64_t want = SplitMix64(seed + w);
      uint64_t got;
      std::memcpy(&got, p + w * 8, 8);
      if (got != want) {
        for (int b = 0; b < 8; ++b)
          errors += ((got >> (8 * b)) & 0xFF) != ((want >> (8 * b)) & 0xFF);
      }
    }
  }
  return errors;
}

}  // namespace kvtier::tools
