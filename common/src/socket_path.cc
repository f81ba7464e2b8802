#include "kvtier/socket_path.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

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

bool UnixSocketListening(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) return false;
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (probe < 0) return false;
  const bool live = connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(probe);
  return live;
}

}  // namespace kvtier
