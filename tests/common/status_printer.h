// Lets gtest print kvtier::StatusCode values by name ("DATA_LOSS") in failures.
#pragma once

#include <ostream>

#include "kvtier/status.h"

namespace kvtier {

inline void PrintTo(StatusCode code, std::ostream* os) { *os << StatusCodeName(code); }

}  // namespace kvtier
