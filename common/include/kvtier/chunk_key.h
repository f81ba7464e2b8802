// ChunkKey: the 128-bit chained prefix hash that names a token chunk.
//
// DESIGN.md "chunk key": no seed; a 128-bit value is serialized as low64 then
// high64, each little-endian (16 bytes).
//   key_0 = XXH3_128bits(namespace_digest(16 B) || tokens[0:C] as LE int32)
//   key_i = XXH3_128bits(key_{i-1}(16 B)       || tokens[iC:(i+1)C])
// Identical in every process, machine and version; golden vectors pin it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvtier {

struct ChunkKey {
  uint64_t lo = 0;
  uint64_t hi = 0;

  static constexpr size_t kBytes = 16;

  friend bool operator==(const ChunkKey&, const ChunkKey&) = default;
  bool IsZero() const { return lo == 0 && hi == 0; }

  // Writes the 16-byte wire form (lo then hi, each little-endian) to `out`.
  void ToBytes(std::byte* out) const;
  std::string ToBytes() const;
  // Reads the 16-byte wire form. REQUIRES: `in` holds 16 bytes.
  static ChunkKey FromBytes(const std::byte* in);
  // The wire form in `bytes`; nullopt unless it is exactly 16 bytes long.
  static std::optional<ChunkKey> FromWire(std::string_view bytes);
  // 32 lower-case hex digits, high64 first (the usual way to print a 128-bit hash).
  std::string ToHex() const;
  // The inverse of ToHex (either case); nullopt unless `hex` is 32 hex digits.
  static std::optional<ChunkKey> FromHex(std::string_view hex);
};

struct ChunkKeyHash {
  size_t operator()(const ChunkKey& k) const {
    return static_cast<size_t>(k.lo ^ (k.hi * 0x9E3779B97F4A7C15ULL));
  }
};

// The namespace digest is a 128-bit value of the same form as a chunk key.
using NamespaceId = ChunkKey;

// The instruction sets the chunk-key hash has a path for. Each gives the same keys; the
// fastest this CPU and OS run is used (on the development VM the AVX-512 path keys a
// 128K-token prompt 1.15-1.22x faster than SSE2 inside `kvtier-bench lookup`;
// docs/BENCHMARKS.md "Hashing on the CPU's vector units").
enum class HashIsa { kBaseline, kAvx2, kAvx512 };
// The path ComputeChunkKeys takes here: the best one this CPU runs.
HashIsa BestHashIsa();
// Whether this CPU and OS run `isa` (kBaseline: always).
bool HashIsaRuns(HashIsa isa);
// "baseline" (SSE2 on x86-64), "avx2" or "avx512".
const char* HashIsaName(HashIsa isa);

// Key of one chunk from its parent (the previous chunk's key, or the namespace
// digest for chunk 0) and its `tokens` (exactly chunk_tokens ids).
ChunkKey ComputeChunkKey(const ChunkKey& parent, std::span<const int32_t> tokens);

// Keys of every full chunk of `tokens` (a prompt of any length; the partial tail
// is not keyed). Returns tokens.size() / chunk_tokens keys.
// REQUIRES: chunk_tokens > 0.
std::vector<ChunkKey> ComputeChunkKeys(const NamespaceId& ns, std::span<const int32_t> tokens,
                                       uint32_t chunk_tokens);
// The same through a chosen path (tests and benchmarks compare them).
// REQUIRES: HashIsaRuns(isa).
std::vector<ChunkKey> ComputeChunkKeys(const NamespaceId& ns, std::span<const int32_t> tokens,
                                       uint32_t chunk_tokens, HashIsa isa);

// Token ids as packed little-endian int32 bytes (the wire and slot-header form).
std::string PackTokens(std::span<const int32_t> tokens);

}  // namespace kvtier
