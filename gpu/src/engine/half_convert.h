// fp16 and bf16 <-> fp32 conversions on the host (round to nearest even), for the host
// compute (compute_params.cc) and for tests. Private to gpu/src/engine (tests include it by
// path).
#pragma once

#include <cstdint>
#include <cstring>

#include "kvtier/gpu/engine/compute.h"

namespace kvtier::gpu::engine::internal {

inline float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint32_t FloatToBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float BFloat16ToFloat(uint16_t h) { return BitsToFloat(uint32_t{h} << 16); }

inline uint16_t FloatToBFloat16(float f) {
  const uint32_t u = FloatToBits(f);
  if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu) != 0) {
    return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN stays a (quiet) NaN.
  }
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

inline float Float16ToFloat(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) return BitsToFloat(sign | 0x7F800000u | (mant << 13));  // Inf, NaN.
  if (exp != 0) return BitsToFloat(sign | ((exp + 112) << 23) | (mant << 13));
  if (mant == 0) return BitsToFloat(sign);  // +-0.
  // Subnormal: mant * 2^-24.
  const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
  return sign != 0 ? -v : v;
}

inline uint16_t FloatToFloat16(float f) {
  const uint32_t u = FloatToBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) {  // Inf or NaN.
    return static_cast<uint16_t>(sign | 0x7C00u | (abs > 0x7F800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // Rounds to Inf.
  if (abs < 0x38800000u) {               // Below the smallest normal (2^-14): subnormal or zero.
    if (abs < 0x33000000u) return sign;  // Below half the smallest subnormal: 0.
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126 - exp;  // So that the result counts units of 2^-24.
    uint32_t half_mant = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half_mant & 1u))) ++half_mant;
    return static_cast<uint16_t>(sign | half_mant);
  }
  uint32_t r = abs - 0x38000000u;  // Rebias exponent 127 -> 15.
  r = r + 0xFFFu + ((r >> 13) & 1u);
  return static_cast<uint16_t>(sign | (r >> 13));
}

inline float ScalarToFloat(ScalarType t, uint16_t bits) {
  return t == ScalarType::kFloat16 ? Float16ToFloat(bits) : BFloat16ToFloat(bits);
}

inline uint16_t FloatToScalar(ScalarType t, float f) {
  return t == ScalarType::kFloat16 ? FloatToFloat16(f) : FloatToBFloat16(f);
}

}  // namespace kvtier::gpu::engine::internal
