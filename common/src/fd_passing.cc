#include "kvtier/fd_passing.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

namespace kvtier {

std::string ArenaSocketPath(const std::string& socket_path) { return socket_path + ".arena"; }

Status SendArenaFd(int sock, const ArenaAnnouncement& msg, int fd) {
  return SendFd(sock, &msg, sizeof(msg), fd);
}

Status SendFd(int sock, const void* msg, size_t bytes, int fd) {
  iovec iov{const_cast<void*>(msg), bytes};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = control;
  mh.msg_controllen = sizeof(control);
  cmsghdr* cm = CMSG_FIRSTHDR(&mh);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(cm), &fd, sizeof(int));
  ssize_t n;
  do {
    n = sendmsg(sock, &mh, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return Status::FromErrno(errno, "sendmsg fd");
  if (static_cast<size_t>(n) != bytes) return Status::IOError("sendmsg fd: short send");
  return Status::Ok();
}

Status CheckDaemonPeer(int sock, const std::string& path) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return Status::FromErrno(errno, "getsockopt(SO_PEERCRED) on " + path);
  }
  if (cred.uid == geteuid() || cred.uid == 0) return Status::Ok();
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  struct stat st {};
  if (stat(dir.c_str(), &st) == 0 && st.st_uid == cred.uid) return Status::Ok();
  return Status::PermissionDenied("the daemon at " + path + " runs as uid " +
                                  std::to_string(cred.uid) + ", neither this process's uid " +
                                  std::to_string(geteuid()) + ", root, nor the owner of " + dir +
                                  ": its arena is not mapped");
}

Result<int> ConnectUnixSocket(const std::string& path, int timeout_ms) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return Status::InvalidArgument("socket path '" + path + "' is longer than 107 bytes");
  }
  const int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (sock < 0) return Status::FromErrno(errno, "socket");
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  // A blocking connect waits on a full backlog for at most SO_SNDTIMEO, then fails with EAGAIN.
  const int ms = timeout_ms < 1 ? 1 : timeout_ms;
  timeval tv{ms / 1000, (ms % 1000) * 1000};
  setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if (connect(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    close(sock);
    if (err == EAGAIN || err == EINPROGRESS || err == ETIMEDOUT || err == EINTR) {
      return Status::Unavailable("connect " + path + " timed out after " + std::to_string(ms) +
                                 " ms: kvtierd is not accepting connections");
    }
    return Status::Unavailable("connect " + path + ": " + std::strerror(err));
  }
  tv = {};
  setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  return sock;
}

Result<std::pair<ArenaAnnouncement, int>> ReceiveArenaFd(const std::string& path, int timeout_ms) {
  auto connected = ConnectUnixSocket(path, timeout_ms);
  if (!connected.ok()) return connected.status();
  const int sock = *connected;
  // The daemon's uid: this process's own, root, or (a daemon of another user
  // under --socket-group) the owner of the socket's directory, which kvtierd
  // must own to serve from it. Anyone else is not trusted with our mappings.
  if (Status st = CheckDaemonPeer(sock, path); !st.ok()) {
    close(sock);
    return st;
  }
  ArenaAnnouncement msg;
  auto fd = ReceiveFd(sock, timeout_ms, &msg, sizeof(msg), path);
  close(sock);
  if (!fd.ok()) return fd.status();
  if (msg.magic != kArenaAnnouncementMagic || msg.version != 1 || *fd < 0) {
    if (*fd >= 0) close(*fd);
    return Status::DataLoss("malformed arena announcement from " + path);
  }
  return std::make_pair(msg, *fd);
}

Result<int> ReceiveFd(int sock, int timeout_ms, void* msg, size_t bytes, const std::string& from) {
  pollfd pfd{sock, POLLIN, 0};
  int pr;
  do {
    pr = poll(&pfd, 1, timeout_ms);
  } while (pr < 0 && errno == EINTR);
  if (pr <= 0) {
    return Status::Unavailable("no answer from " + from + " within " + std::to_string(timeout_ms) +
                               " ms");
  }
  iovec iov{msg, bytes};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = control;
  mh.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return Status::FromErrno(errno, "recvmsg from " + from);
  int fd = -1;
  for (cmsghdr* cm = CMSG_FIRSTHDR(&mh); cm != nullptr; cm = CMSG_NXTHDR(&mh, cm)) {
    if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
      std::memcpy(&fd, CMSG_DATA(cm), sizeof(int));
    }
  }
  if (static_cast<size_t>(n) != bytes) {
    if (fd >= 0) close(fd);
    return Status::DataLoss("short message (" + std::to_string(n) + " of " + std::to_string(bytes) +
                            " bytes) from " + from);
  }
  return fd;
}

}  // namespace kvtier
