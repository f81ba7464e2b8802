// FUZZ_CHECK: the fuzz targets' assertion. A failed check prints what broke and aborts, so
// that libFuzzer records the input as a crash (as it does for an ASan or UBSan report).
#pragma once

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(cond, what)                                                                     \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: %s\n", __FILE__, __LINE__, #cond, what); \
      std::abort();                                                                                \
    }                                                                                              \
  } while (0)
