// kvtierd's two Unix sockets (gRPC control and the arena hand-over) and who
// may connect to them (DESIGN.md "Threat model"): a peer is checked with
// SO_PEERCRED at accept and served only when it runs as the daemon's own uid,
// as root, or (with --socket-group) as a member of that group. Sockets are
// 0600, or 0660 with a group, whatever the umask. kvtierd accepts gRPC
// connections itself and hands each allowed one to the gRPC server, since
// gRPC's own listener cannot tell who connected.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "kvtier/status.h"

namespace kvtier {

class PeerPolicy {
 public:
  // `group`: --socket-group's gid, if any.
  PeerPolicy(uid_t self, std::optional<gid_t> group) : self_(self), group_(group) {}

  // The peer of connected Unix socket `fd`. Errors: PERMISSION_DENIED naming
  // the peer's pid, uid and gid; the errno of getsockopt.
  Status Check(int fd) const;

 private:
  bool InGroup(pid_t pid, uid_t uid, gid_t gid) const;

  uid_t self_;
  std::optional<gid_t> group_;
};

// Who connected on each gRPC connection (SO_PEERCRED at accept), by fd, for
// the admin service's audit lines: gRPC names a connection handed over with
// AddInsecureChannelFromFd only "fd:N". An fd's entry is replaced when the
// number is accepted again.
//
// Thread-safety: thread-safe.
class PeerBook {
 public:
  // Records the peer of connected Unix socket `fd` ("pid P uid U gid G").
  void Record(int fd);
  // The peer recorded for gRPC's peer text `grpc_peer` ("fd:N"), or "" when
  // none is (another form of peer text, or an fd never recorded).
  std::string Describe(std::string_view grpc_peer) const;

 private:
  mutable std::mutex mu_;
  std::unordered_map<int, std::string> by_fd_;  // GUARDED_BY(mu_)
};

// A listening Unix stream socket at `path` (which must not exist), chmod'ed to
// `mode` and, with a group, chown'ed to it. Returns the fd (CLOEXEC,
// non-blocking accepts are polled).
Result<int> ListenUnix(const std::string& path, mode_t mode, std::optional<gid_t> group);

}  // namespace kvtier
