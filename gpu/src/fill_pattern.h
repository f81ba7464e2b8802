// The kvtier test fill pattern, shared by the CUDA kernel and the host backend so the two
// produce identical bytes. Contract: see Runtime::LaunchFill.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define KVTIER_HOST_DEVICE __host__ __device__
#else
#define KVTIER_HOST_DEVICE
#endif

namespace kvtier::gpu::internal {

// Output `word_index` (0-based) of a SplitMix64 generator seeded with `seed`
// (Steele, Lea, Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014).
KVTIER_HOST_DEVICE inline uint64_t FillPatternWord(uint64_t seed, uint64_t word_index) {
  uint64_t z = seed + (word_index + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Byte at `offset` of the pattern: byte (offset % 8), little-endian, of word offset / 8.
KVTIER_HOST_DEVICE inline uint8_t FillPatternByte(uint64_t seed, uint64_t offset) {
  return static_cast<uint8_t>(FillPatternWord(seed, offset / 8) >> (8 * (offset % 8)));
}

}  // namespace kvtier::gpu::internal
