// Where kvtierd listens by default.
#pragma once

#include <string>

namespace kvtier {

// ${XDG_RUNTIME_DIR:-/tmp}/kvtier/kvtierd.sock
std::string DefaultSocketPath();

}  // namespace kvtier
