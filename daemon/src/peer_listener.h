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
#include <optional>
#include <string>

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

// A listening Unix stream socket at `path` (which must not exist), chmod'ed to
// `mode` and, with a group, chown'ed to it. Returns the fd (CLOEXEC,
// non-blocking accepts are polled).
Result<int> ListenUnix(const std::string& path, mode_t mode, std::optional<gid_t> group);

}  // namespace kvtier
