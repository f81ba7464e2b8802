#include "kvtier/tools/table_cell.h"

#include <gtest/gtest.h>

namespace kvtier::tools {
namespace {

// kvtierctl's namespace table padded model ids by bytes (printf's %-28s) and cut
// them at byte 28: a non-ASCII name shifted the columns after it.
TEST(TableCellTest, WidthCountsWhatATerminalShows) {
  EXPECT_EQ(DisplayWidth("llama-3"), 7u);
  EXPECT_EQ(DisplayWidth("m\xc3\xbcnchen"), 7u);            // "münchen": ü is 2 bytes, 1 column
  EXPECT_EQ(DisplayWidth("\xe6\xa8\xa1\xe5\x9e\x8b"), 4u);  // "模型": 2 wide characters
  EXPECT_EQ(DisplayWidth("e\xcc\x81"), 1u);                 // e + combining acute
  EXPECT_EQ(DisplayWidth("a\xffz"), 3u);                    // a byte that is not UTF-8 counts 1
}

TEST(TableCellTest, CellsArePaddedToTheirColumnsNotTheirBytes) {
  EXPECT_EQ(Cell("m\xc3\xbcnchen", 10), "m\xc3\xbcnchen   ");
  EXPECT_EQ(DisplayWidth(Cell("\xe6\xa8\xa1\xe5\x9e\x8b", 10)), 10u);
  EXPECT_EQ(Cell("", 3), "   ");
}

TEST(TableCellTest, ALongTextIsCutAtACharacterWithAMark) {
  EXPECT_EQ(Cell("abcdefgh", 5), "abcd~");
  // "ü" spans bytes 3-4 of "abü..." : a byte cut at 4 would split it.
  EXPECT_EQ(Cell("ab\xc3\xbc"
                 "cdef",
                 4),
            "ab\xc3\xbc~");
  // A wide character that would straddle the edge is left out; its column padded.
  const std::string wide = Cell("a\xe6\xa8\xa1\xe5\x9e\x8b", 4);  // "a模型" is 5 columns
  EXPECT_EQ(wide, "a\xe6\xa8\xa1~");
  EXPECT_EQ(DisplayWidth(Cell("a\xe6\xa8\xa1\xe5\x9e\x8b"
                              "bc",
                              5)),
            5u);
  EXPECT_EQ(Cell("abc", 0), "");
}

}  // namespace
}  // namespace kvtier::tools
