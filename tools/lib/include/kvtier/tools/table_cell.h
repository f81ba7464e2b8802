// Text cells of the tools' tables, padded by what a terminal shows rather than
// by bytes: printf's %-28s pads UTF-8 by bytes, so a model id with non-ASCII
// letters shifted every column after it, and cutting it at byte 28 could split
// a character.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace kvtier::tools {

// Columns `text` takes on a terminal (wcwidth of each character: 2 for wide
// East Asian ones, 0 for combining marks). A byte that is not UTF-8 counts as 1.
size_t DisplayWidth(std::string_view text);

// `text` cut and padded with spaces to exactly `width` columns. A cut ends at
// a character boundary with "~" (a wide character that would straddle the
// edge is left out, and its column padded).
std::string Cell(std::string_view text, size_t width);

}  // namespace kvtier::tools
