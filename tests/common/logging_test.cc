#include "kvtier/logging.h"

#include <gtest/gtest.h>

#include <thread>

namespace kvtier {
namespace {

TEST(LogLimiter, LetsOneMessageThroughPerPeriodAndCountsTheRest) {
  LogLimiter limiter(std::chrono::milliseconds(200));
  auto first = limiter.Admit();
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(*first, 0u);
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(limiter.Admit().has_value());
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  auto next = limiter.Admit();
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(*next, 5u) << "the ones held back are counted on the next message";
  EXPECT_FALSE(limiter.Admit().has_value());
  EXPECT_EQ(HeldBack(0), "");
  EXPECT_EQ(HeldBack(5), " (5 more like it since the last warning)");
}

}  // namespace
}  // namespace kvtier
