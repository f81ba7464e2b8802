#include "kvtier/chunk_key.h"

#include <bit>
#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "chunk_hash.h"

namespace kvtier {
namespace {

static_assert(std::endian::native == std::endian::little,
              "kvtier serializes keys and tokens little-endian; big-endian hosts need byte swaps");

chunk_hash::ChainFn ChainOf(HashIsa isa) {
  switch (isa) {
#if KVTIER_HASH_X86
    case HashIsa::kAvx512:
      return chunk_hash::ChainAvx512;
    case HashIsa::kAvx2:
      return chunk_hash::ChainAvx2;
#endif
    default:
      return chunk_hash::ChainBaseline;
  }
}

chunk_hash::ChainFn BestChain() {
  static const chunk_hash::ChainFn fn = ChainOf(BestHashIsa());
  return fn;
}

std::vector<ChunkKey> Chain(chunk_hash::ChainFn fn, const ChunkKey& parent,
                            std::span<const int32_t> tokens, uint32_t chunk_tokens) {
  std::vector<ChunkKey> keys(tokens.size() / chunk_tokens);
  fn(parent.lo, parent.hi, tokens.data(), chunk_tokens, keys.size(),
     reinterpret_cast<uint64_t*>(keys.data()));
  return keys;
}

}  // namespace

bool HashIsaRuns(HashIsa isa) {
  switch (isa) {
    case HashIsa::kBaseline:
      return true;
#if KVTIER_HASH_X86
    // GCC's and clang's checks include the OS's (XCR0: the registers are saved).
    case HashIsa::kAvx2:
      return __builtin_cpu_supports("avx2");
    case HashIsa::kAvx512:
      return __builtin_cpu_supports("avx512f");
#endif
    default:
      return false;
  }
}

HashIsa BestHashIsa() {
  for (HashIsa isa : {HashIsa::kAvx512, HashIsa::kAvx2}) {
    if (HashIsaRuns(isa)) return isa;
  }
  return HashIsa::kBaseline;
}

const char* HashIsaName(HashIsa isa) {
  switch (isa) {
    case HashIsa::kAvx2:
      return "avx2";
    case HashIsa::kAvx512:
      return "avx512";
    default:
      return "baseline";
  }
}

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

std::optional<ChunkKey> ChunkKey::FromWire(std::string_view bytes) {
  if (bytes.size() != kBytes) return std::nullopt;
  return FromBytes(reinterpret_cast<const std::byte*>(bytes.data()));
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
  ChunkKey key;
  static_assert(sizeof(ChunkKey) == 16 && offsetof(ChunkKey, hi) == 8);
  BestChain()(parent.lo, parent.hi, tokens.data(), tokens.size(), 1,
              reinterpret_cast<uint64_t*>(&key));
  return key;
}

std::vector<ChunkKey> ComputeChunkKeys(const NamespaceId& ns, std::span<const int32_t> tokens,
                                       uint32_t chunk_tokens) {
  return Chain(BestChain(), ns, tokens, chunk_tokens);
}

std::vector<ChunkKey> ComputeChunkKeys(const NamespaceId& ns, std::span<const int32_t> tokens,
                                       uint32_t chunk_tokens, HashIsa isa) {
  return Chain(ChainOf(isa), ns, tokens, chunk_tokens);
}

std::string PackTokens(std::span<const int32_t> tokens) {
  return std::string(reinterpret_cast<const char*>(tokens.data()), tokens.size_bytes());
}

}  // namespace kvtier
