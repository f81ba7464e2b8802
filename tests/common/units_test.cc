// ParseBytes / FormatBytes / AlignUp.
#include "kvtier/units.h"

#include <gtest/gtest.h>

#include "common/status_printer.h"

namespace kvtier {
namespace {

uint64_t MustParse(std::string_view text) {
  auto r = ParseBytes(text);
  EXPECT_TRUE(r.ok()) << text << ": " << r.status().ToString();
  return r.ok() ? *r : 0;
}

TEST(ParseBytes, BinarySuffixes) {
  EXPECT_EQ(MustParse("512MiB"), 512 * kMiB);
  EXPECT_EQ(MustParse("4GiB"), 4 * kGiB);
  EXPECT_EQ(MustParse("64KiB"), 64 * kKiB);
  EXPECT_EQ(MustParse("1TiB"), kTiB);
  EXPECT_EQ(MustParse("7B"), 7u);
}

TEST(ParseBytes, PlainNumberIsBytes) {
  EXPECT_EQ(MustParse("1073741824"), kGiB);
  EXPECT_EQ(MustParse("0"), 0u);
}

TEST(ParseBytes, ShortSuffixesArePowersOf1024) {
  EXPECT_EQ(MustParse("2G"), 2 * kGiB);
  EXPECT_EQ(MustParse("3m"), 3 * kMiB);
  EXPECT_EQ(MustParse("5 KiB"), 5 * kKiB);
}

TEST(ParseBytes, DecimalLookingSuffixesAreRefusedAsAmbiguous) {
  for (const char* text : {"2GB", "64MB", "1kb", "3TB"}) {
    auto r = ParseBytes(text);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("ambiguous"), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(text), std::string::npos) << r.status().message();
  }
}

TEST(ParseBytes, FractionsAreRefusedWithAHint) {
  auto r = ParseBytes("1.5GiB");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("whole number"), std::string::npos) << r.status().message();
}

TEST(ParseBytes, EmptyIsAnError) {
  auto r = ParseBytes("");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
}

TEST(ParseBytes, UnknownSuffixIsAnErrorNamingTheText) {
  auto r = ParseBytes("12XB");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("12XB"), std::string::npos) << r.status().message();
}

TEST(ParseBytes, NoNumberIsAnError) {
  EXPECT_FALSE(ParseBytes("MiB").ok());
  EXPECT_FALSE(ParseBytes("-1").ok());
  EXPECT_FALSE(ParseBytes(" 1").ok());
}

TEST(ParseBytes, OverflowIsAnError) {
  EXPECT_EQ(MustParse("18446744073709551615"), UINT64_MAX);
  auto digits = ParseBytes("18446744073709551616");
  ASSERT_FALSE(digits.ok());
  EXPECT_EQ(digits.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(digits.status().message().find("overflow"), std::string::npos);
  auto unit = ParseBytes("16777216TiB");  // 2^24 * 2^40 = 2^64
  ASSERT_FALSE(unit.ok());
  EXPECT_NE(unit.status().message().find("overflow"), std::string::npos);
  EXPECT_EQ(MustParse("16777215TiB"), 16777215 * kTiB);
}

TEST(FormatBytes, PicksTheLargestUnit) {
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(256 * kKiB), "256.0 KiB");
  EXPECT_EQ(FormatBytes(kGiB + kGiB / 2), "1.5 GiB");
}

TEST(AlignUp, RoundsUpToTheAlignment) {
  static_assert(AlignUp(0, 4096) == 0);
  EXPECT_EQ(AlignUp(1, 4096), 4096u);
  EXPECT_EQ(AlignUp(4096, 4096), 4096u);
  EXPECT_EQ(AlignUp(4097, 256), 4352u);
}

}  // namespace
}  // namespace kvtier
