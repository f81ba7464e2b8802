// Where kvtierd listens by default.
#pragma once

#include <string>

#include "kvtier/status.h"

namespace kvtier {

// ${XDG_RUNTIME_DIR:-/tmp}/kvtier/kvtierd.sock
std::string DefaultSocketPath();

// Checks a daemon socket path a client is about to use: it must fit a Unix
// socket address with room for the ".arena" suffix (at most 101 bytes), and
// anything already at the path must be a socket. A missing path is fine (the
// daemon may start later). Errors: INVALID_ARGUMENT naming the path.
Status CheckSocketPath(const std::string& path);

// Whether a program listens on the Unix stream socket at `path` (a connect
// succeeds): a socket file left by a dead process does not.
bool UnixSocketListening(const std::string& path);

}  // namespace kvtier
