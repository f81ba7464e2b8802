#include "kvtier/tools/table_cell.h"

#include <locale.h>

#include <clocale>
#include <cwchar>

namespace kvtier::tools {
namespace {

// One character of `text` from `pos`: its bytes and columns (an invalid byte: 1 and 1).
struct Glyph {
  size_t bytes;
  size_t columns;
};

Glyph NextGlyph(std::string_view text, size_t pos) {
  // wcwidth needs a UTF-8 LC_CTYPE; the tools run under whatever locale the
  // shell has, so use C.UTF-8 (built into glibc) for this thread's calls only.
  static const locale_t utf8 = newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(0));
  const locale_t old =
      utf8 != static_cast<locale_t>(0) ? uselocale(utf8) : static_cast<locale_t>(0);
  std::mbstate_t state{};
  wchar_t wc = 0;
  const size_t n = std::mbrtowc(&wc, text.data() + pos, text.size() - pos, &state);
  Glyph g{1, 1};
  if (n != static_cast<size_t>(-1) && n != static_cast<size_t>(-2) && n != 0) {
    const int w = wcwidth(wc);
    g = {n, w < 0 ? size_t{1} : static_cast<size_t>(w)};
  }
  if (old != static_cast<locale_t>(0)) uselocale(old);
  return g;
}

}  // namespace

size_t DisplayWidth(std::string_view text) {
  size_t columns = 0;
  for (size_t pos = 0; pos < text.size();) {
    const Glyph g = NextGlyph(text, pos);
    columns += g.columns;
    pos += g.bytes;
  }
  return columns;
}

std::string Cell(std::string_view text, size_t width) {
  std::string out;
  size_t columns = 0;
  if (DisplayWidth(text) <= width) {
    out = text;
    columns = DisplayWidth(text);
  } else if (width > 0) {
    for (size_t pos = 0; pos < text.size();) {  // keep what fits before the "~"
      const Glyph g = NextGlyph(text, pos);
      if (columns + g.columns > width - 1) break;
      out.append(text.substr(pos, g.bytes));
      columns += g.columns;
      pos += g.bytes;
    }
    out += '~';
    ++columns;
  }
  out.append(width > columns ? width - columns : 0, ' ');
  return out;
}

}  // namespace kvtier::tools
