#include "kvtier/socket_path.h"

#include <cstdlib>

namespace kvtier {

std::string DefaultSocketPath() {
  const char* runtime_dir = std::getenv("XDG_RUNTIME_DIR");
  std::string base = (runtime_dir != nullptr && runtime_dir[0] != '\0') ? runtime_dir : "/tmp";
  return base + "/kvtier/kvtierd.sock";
}

}  // namespace kvtier
