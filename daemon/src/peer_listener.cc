#include "peer_listener.h"

#include <grp.h>
#include <pwd.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

namespace kvtier {

bool PeerPolicy::InGroup(pid_t pid, uid_t uid, gid_t gid) const {
  if (!group_) return false;
  if (gid == *group_) return true;
  // The peer process's own supplementary groups (as the kernel checks file
  // access), then those the group database gives its user.
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("Groups:", 0) != 0) continue;
    std::istringstream ids(line.substr(7));
    for (gid_t g; ids >> g;) {
      if (g == *group_) return true;
    }
  }
  std::vector<char> buf(16384);
  passwd pw{};
  passwd* found = nullptr;
  if (getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) != 0 || found == nullptr) return false;
  int n = 64;
  std::vector<gid_t> groups(static_cast<size_t>(n));
  if (getgrouplist(pw.pw_name, gid, groups.data(), &n) < 0) {
    groups.resize(static_cast<size_t>(n));
    if (getgrouplist(pw.pw_name, gid, groups.data(), &n) < 0) return false;
  }
  groups.resize(static_cast<size_t>(n));
  return std::find(groups.begin(), groups.end(), *group_) != groups.end();
}

Status PeerPolicy::Check(int fd) const {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return Status::FromErrno(errno, "getsockopt(SO_PEERCRED)");
  }
  if (cred.uid == self_ || cred.uid == 0 || InGroup(cred.pid, cred.uid, cred.gid)) {
    return Status::Ok();
  }
  return Status::PermissionDenied(
      "peer pid " + std::to_string(cred.pid) + " (uid " + std::to_string(cred.uid) + ", gid " +
      std::to_string(cred.gid) + ") is neither kvtierd's uid " + std::to_string(self_) + ", root" +
      (group_ ? ", nor a member of --socket-group" : " (no --socket-group)"));
}

void PeerBook::Record(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return;
  std::string who = "pid " + std::to_string(cred.pid) + " uid " + std::to_string(cred.uid) +
                    " gid " + std::to_string(cred.gid);
  std::lock_guard lock(mu_);
  by_fd_[fd] = std::move(who);
}

std::string PeerBook::Describe(std::string_view grpc_peer) const {
  constexpr std::string_view kPrefix = "fd:";
  if (grpc_peer.substr(0, kPrefix.size()) != kPrefix) return "";
  int fd = -1;
  const std::string_view num = grpc_peer.substr(kPrefix.size());
  const auto [end, ec] = std::from_chars(num.data(), num.data() + num.size(), fd);
  if (ec != std::errc() || end != num.data() + num.size()) return "";
  std::lock_guard lock(mu_);
  auto it = by_fd_.find(fd);
  return it == by_fd_.end() ? "" : it->second;
}

Result<int> ListenUnix(const std::string& path, mode_t mode, std::optional<gid_t> group) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::FromErrno(errno, "socket");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    close(fd);
    return Status::InvalidArgument("socket path " + path + " is too long for a Unix socket");
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  Status st;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    st = Status::FromErrno(errno, "bind " + path);
  } else if (chmod(path.c_str(), mode) != 0) {  // the umask does not decide who connects
    st = Status::FromErrno(errno, "chmod " + path);
  } else if (group && chown(path.c_str(), static_cast<uid_t>(-1), *group) != 0) {
    st = Status::FromErrno(errno, "chown " + path);
  } else if (listen(fd, 512) != 0) {
    st = Status::FromErrno(errno, "listen " + path);
  }
  if (st.ok()) return fd;
  close(fd);
  return st;
}

}  // namespace kvtier
