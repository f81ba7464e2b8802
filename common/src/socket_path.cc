#include "kvtier/socket_path.h"

#include <sys/stat.h>

#include <cstdlib>

namespace kvtier {

std::string DefaultSocketPath() {
  const char* runtime_dir = std::getenv("XDG_RUNTIME_DIR");
  std::string base = (runtime_dir != nullptr && runtime_dir[0] != '\0') ? runtime_dir : "/tmp";
  return base + "/kvtier/kvtierd.sock";
}

Status CheckSocketPath(const std::string& path) {
  if (path.empty()) return Status::InvalidArgument("socket path is empty");
  if (path.size() > 101) {
    return Status::InvalidArgument("socket path '" + path +
                                   "' is longer than 101 bytes (a Unix socket address holds 107, "
                                   "and the arena socket adds \".arena\")");
  }
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0 && !S_ISSOCK(st.st_mode)) {
    return Status::InvalidArgument(path + " is not a socket (is kvtierd's --socket elsewhere?)");
  }
  return Status::Ok();
}

}  // namespace kvtier
