// Passing the arena fd over a Unix socket with SCM_RIGHTS (gRPC cannot).
//
// Protocol of the arena socket (`<socket>.arena`): a client connects; the daemon
// sends one ArenaAnnouncement with the arena fd attached and closes.
#pragma once

#include <cstdint>
#include <string>

#include "kvtier/status.h"

namespace kvtier {

inline constexpr uint64_t kArenaAnnouncementMagic = 0x414E455241545650ULL;  // "PVTARENA"

struct ArenaAnnouncement {
  uint64_t magic = kArenaAnnouncementMagic;
  uint32_t version = 1;
  uint32_t reserved = 0;
  uint64_t epoch = 0;        // changes on every daemon start
  uint64_t arena_bytes = 0;  // size of the mapping
};

// Path of the arena socket that belongs to the gRPC socket `socket_path`.
std::string ArenaSocketPath(const std::string& socket_path);

// Sends `msg` with `fd` attached on the connected socket `sock`. Errors: IO_ERROR.
Status SendArenaFd(int sock, const ArenaAnnouncement& msg, int fd);
// Sends `bytes` bytes at `msg` with `fd` attached (SCM_RIGHTS). Errors: IO_ERROR.
Status SendFd(int sock, const void* msg, size_t bytes, int fd);
// Waits at most `timeout_ms` for one message of exactly `bytes` bytes on
// `sock` into `msg`, and returns the fd attached to it (-1 for none; the
// caller owns it). `from` names the peer in errors. Errors: UNAVAILABLE when
// nothing came in time, IO_ERROR from recvmsg, DATA_LOSS for another length.
Result<int> ReceiveFd(int sock, int timeout_ms, void* msg, size_t bytes, const std::string& from);

// A blocking, close-on-exec Unix stream socket connected to `path` (caller
// owns it). A listener whose backlog is full (a stopped daemon) is waited for
// at most `timeout_ms`. Errors: INVALID_ARGUMENT for a path too long,
// UNAVAILABLE naming the path and why (no listener, timed out).
Result<int> ConnectUnixSocket(const std::string& path, int timeout_ms);

// The daemon's uid (SO_PEERCRED on the connected `sock`, named `path` in
// errors) must be this process's, root's, or that of the socket directory's
// owner. Errors: PERMISSION_DENIED naming the uids, IO_ERROR.
Status CheckDaemonPeer(int sock, const std::string& path);

// Connects to `arena_socket_path`, receives the announcement and the fd
// (caller owns it). Waits at most `timeout_ms`. The daemon's uid (SO_PEERCRED)
// must be this process's, root's, or that of the socket directory's owner.
// Errors: UNAVAILABLE when no daemon listens, PERMISSION_DENIED for a daemon
// of another uid, DATA_LOSS for a malformed message, IO_ERROR otherwise.
Result<std::pair<ArenaAnnouncement, int>> ReceiveArenaFd(const std::string& arena_socket_path,
                                                         int timeout_ms);

}  // namespace kvtier
