#include "kvtier/chunk_key.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t for streaming hashes
#include <xxhash.h>

#include <bit>
#include <cstring>

namespace kvtier {
namespace {

static_assert(std::endian::native == std::endian::little,
              "kvtier serializes keys and tokens little-endian; big-endian hosts need byte swaps");

}  // namespace

void ChunkKey::ToBytes(std::byte* out) const {
  std::memcpy(out, &lo, 8);
  std::memcpy(out + 8, &hi, 8);
}

std::string ChunkKey::ToBytes() const {
  std::string s(kBytes, '\0');
  ToBytes(reinterpret_cast<std::byte*>(s.data()));
  return s;
}

ChunkKey ChunkKey::FromBytes(const std::byte* in) {
  ChunkKey k;
  std::memcpy(&k.lo, in, 8);
  std::memcpy(&k.hi, in + 8, 8);
  return k;
}

std::string ChunkKey::ToHex() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s(32, '0');
  for (int i = 0; i < 16; ++i) {
    s[15 - i] = kDigits[(hi >> (4 * i)) & 0xF];
    s[31 - i] = kDigits[(lo >> (4 * i)) & 0xF];
  }
  return s;
}

std::optional<ChunkKey> ChunkKey::FromHex(std::string_view hex) {
  if (hex.size() != 32) return std::nullopt;
  ChunkKey k;
  for (size_t i = 0; i < 32; ++i) {
    const char c = hex[i];
    uint64_t v;
    if (c >= '0' && c <= '9') {
      v = static_cast<uint64_t>(c - '0');
    } else if (c >= 'a' && c <= 'f') {
      v = static_cast<uint64_t>(c - 'a' + 10);
    } else if (c >= 'A' && c <= 'F') {
      v = static_cast<uint64_t>(c - 'A' + 10);
    } else {
      return std::nullopt;
    }
    uint64_t& half = i < 16 ? k.hi : k.lo;
    half = (half << 4) | v;
  }
  return k;
}

ChunkKey ComputeChunkKey(const ChunkKey& parent, std::span<const int32_t> tokens) {
  XXH3_state_t state;
  XXH3_128bits_reset(&state);
  std::byte parent_bytes[ChunkKey::kBytes];
  parent.ToBytes(parent_bytes);
  XXH3_128bits_update(&state, parent_bytes, sizeof(parent_bytes));
  XXH3_128bits_update(&state, tokens.data(), tokens.size_bytes());
  XXH128_hash_t h = XXH3_128bits_digest(&state);
  return ChunkKey{h.low64, h.high64};
}

std::vector<ChunkKey> ComputeChunkKeys(const NamespaceId& ns, std::span<const int32_t> tokens,
                                       uint32_t chunk_tokens) {
  const size_t num_chunks = tokens.size() / chunk_tokens;
  std::vector<ChunkKey> keys;
  keys.reserve(num_chunks);
  ChunkKey parent = ns;
  for (size_t i = 0; i < num_chunks; ++i) {
    parent = ComputeChunkKey(parent, tokens.subspan(i * chunk_tokens, chunk_tokens));
    keys.push_back(parent);
  }
  return keys;
}

std::string PackTokens(std::span<const int32_t> tokens) {
  return std::string(reinterpret_cast<const char*>(tokens.data()), tokens.size_bytes());
}

}  // namespace kvtier
