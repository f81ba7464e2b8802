// The compute-operation suite on the host-emulation backend (label unit), plus the host
// compute's fp16/bf16 conversions against exact values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "compute_behaviour_test.h"
#include "half_convert.h"  // gpu/src/engine: the host compute's conversions

namespace kvtier::gpu::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(Host, ComputeBehaviourTest, ::testing::Values(Backend::kHost),
                         BackendName);

TEST(HalfConvert, Float16RoundsToNearestEvenAndSaturatesToInfinity) {
  using engine::internal::Float16ToFloat;
  using engine::internal::FloatToFloat16;
  EXPECT_EQ(FloatToFloat16(1.0f), 0x3C00);
  EXPECT_EQ(FloatToFloat16(-2.0f), 0xC000);
  EXPECT_EQ(FloatToFloat16(65504.0f), 0x7BFF);               // largest finite
  EXPECT_EQ(FloatToFloat16(65519.0f), 0x7BFF);               // below the halfway point to 65536
  EXPECT_EQ(FloatToFloat16(65520.0f), 0x7C00);               // halfway: rounds to even = infinity
  EXPECT_EQ(FloatToFloat16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToFloat16(std::ldexp(1.0f, -25)), 0x0000);  // halfway to 0: even
  EXPECT_EQ(FloatToFloat16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(FloatToFloat16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);      // tie: even
  EXPECT_EQ(FloatToFloat16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);  // tie: even
  EXPECT_TRUE(std::isnan(Float16ToFloat(FloatToFloat16(std::numeric_limits<float>::quiet_NaN()))));
  for (uint32_t b = 0; b < 0x7C00; ++b) {  // every finite positive value round-trips
    ASSERT_EQ(FloatToFloat16(Float16ToFloat(static_cast<uint16_t>(b))), b);
    ASSERT_EQ(FloatToFloat16(-Float16ToFloat(static_cast<uint16_t>(b))), b | 0x8000);
  }
}

TEST(HalfConvert, BFloat16RoundsToNearestEven) {
  using engine::internal::BFloat16ToFloat;
  using engine::internal::FloatToBFloat16;
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3F80);
  EXPECT_EQ(FloatToBFloat16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);      // tie: even
  EXPECT_EQ(FloatToBFloat16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);  // tie: even
  EXPECT_EQ(BFloat16ToFloat(0xC040), -3.0f);
  EXPECT_TRUE(
      std::isnan(BFloat16ToFloat(FloatToBFloat16(std::numeric_limits<float>::quiet_NaN()))));
}

}  // namespace
}  // namespace kvtier::gpu::testing
