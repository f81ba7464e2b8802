// FirstNonUtf8Byte (kvtier/utf8.h) against RFC 3629's table of well-formed
// sequences (section 4), byte by byte at each boundary.
#include "kvtier/utf8.h"

#include <string>

#include "gtest/gtest.h"

namespace kvtier {
namespace {

TEST(Utf8, WellFormedTextIsAccepted) {
  for (const std::string& s : {std::string(), std::string("cmpl-42"), std::string("caf\xc3\xa9"),
                               std::string("\xe2\x82\xac"),      // U+20AC
                               std::string("\xed\x9f\xbf"),      // U+D7FF, before surrogates
                               std::string("\xee\x80\x80"),      // U+E000, after them
                               std::string("\xf0\x90\x80\x80"),  // U+10000
                               std::string("\xf4\x8f\xbf\xbf"),  // U+10FFFF, the last
                               std::string("a\0b", 3)}) {        // NUL is UTF-8
    EXPECT_EQ(FirstNonUtf8Byte(s), s.size()) << s;
  }
}

TEST(Utf8, EachKindOfIllFormedSequenceIsFoundAtItsFirstByte) {
  struct Row {
    std::string s;
    size_t bad;
  };
  const Row rows[] = {
      {"ab\xff", 2},            // never a UTF-8 byte
      {"\x80", 0},              // a continuation byte alone
      {"x\xc3", 1},             // cut short
      {"\xc3\x28", 0},          // a lead byte without its continuation
      {"\xc0\xaf", 0},          // overlong '/'
      {"\xc1\xbf", 0},          // overlong
      {"\xe0\x80\xaf", 0},      // overlong, three bytes
      {"\xed\xa0\x80", 0},      // U+D800, a surrogate
      {"\xf0\x8f\xbf\xbf", 0},  // overlong, four bytes
      {"\xf4\x90\x80\x80", 0},  // U+110000, past the last code point
      {"\xf5\x80\x80\x80", 0},  // a lead byte UTF-8 never uses
      {"\xe2\x82", 0},          // three bytes cut short
      {"ok\xe2\x82\x28", 2},    // third byte not a continuation
  };
  for (const Row& r : rows) EXPECT_EQ(FirstNonUtf8Byte(r.s), r.bad) << testing::PrintToString(r.s);
}

}  // namespace
}  // namespace kvtier
