// Daemon: kvtierd's process-level parts around CacheCore: the socket directory
// and its lock file, the arena socket that hands out the memfd, the gRPC server
// and the TTL sweeper.
//
// Start-up order: directory (created 0700, or 0750 + group; an existing one is
// left as it is, with a warning when it is wider) -> lock file (flock; a second
// daemon on the same path is refused and touches nothing) -> arena -> arena
// socket -> gRPC.
// Shutdown undoes it and removes the socket files.
//
// Thread-safety: Start/Wait/Shutdown from one thread; Shutdown may be called
// from a signal-waiting thread.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <optional>
#include <thread>

#include "kvtier/clock.h"
#include "kvtier/daemon/cache_core.h"
#include "kvtier/daemon/daemon_options.h"

namespace grpc {
class Server;
}

namespace kvtier {

class KvCacheService;
class AdminService;
class PeerBook;
class RingServer;
class MetricsServer;

class Daemon {
 public:
  // Errors: FAILED_PRECONDITION when another daemon holds the socket's lock,
  // INVALID_ARGUMENT for an unknown group, IO_ERROR from the file system or
  // the arena, UNAVAILABLE when gRPC cannot listen.
  static Result<std::unique_ptr<Daemon>> Start(const DaemonOptions& options);
  ~Daemon();

  // Stops serving (idempotent). Pending RPCs get a short grace period; pending
  // NVMe writes get options.drain_timeout (progress logged each second), or
  // until `*abort` turns true (a second signal): then kvtierd stops with what
  // is durable. Returns the chunks the drain left unwritten because it was cut
  // short (by `*abort` or the timeout); 0 when it finished, or NVMe is off.
  size_t Shutdown(const std::atomic<bool>* abort = nullptr);

  CacheCore& core() { return *core_; }
  // The port /metrics listens on; 0 when metrics are off.
  int metrics_port() const;

 private:
  explicit Daemon(const DaemonOptions& options);
  Status PrepareSocketDir();
  Status StartArenaSocket();
  // Accepts on both sockets, checks each peer (PeerPolicy), then sends an
  // arena connection the memfd or hands a gRPC one to the server.
  void AcceptLoop();
  mode_t SocketMode() const;  // 0600, or 0660 with --socket-group
  std::optional<gid_t> SocketGroup() const;
  void SweepLoop();
  // /metrics on options_.metrics_address (nothing when off).
  Status StartMetrics();
  // KV events on options_.events_address (nothing when it is "").
  Status StartEvents();
  void NvmeLoop();  // write-through worker
  // Shutdown's NVMe drain, bounded by drain_timeout and `abort`: the chunks
  // left unwritten because it was cut short.
  size_t DrainNvme(const std::atomic<bool>* abort);

  DaemonOptions options_;
  int lock_fd_ = -1;
  bool owns_socket_ = false;
  gid_t socket_gid_ = static_cast<gid_t>(
      -1);  // --socket-group, looked up once  // holds the lock: the socket files are ours
  int arena_listen_fd_ = -1;
  int grpc_listen_fd_ = -1;
  // Before core_, so destroyed after it: the core tells it events until it goes.
  std::unique_ptr<KvEventPublisher> events_;  // nullptr when off
  std::unique_ptr<CacheCore> core_;
  std::unique_ptr<RingServer> ring_server_;  // the control ring; stopped before core_ goes
  std::unique_ptr<KvCacheService> kv_service_;
  std::unique_ptr<PeerBook> peer_book_;  // gRPC connections' peers, for the admin audit lines
  std::unique_ptr<AdminService> admin_service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<MetricsServer> metrics_;  // nullptr when off
  std::atomic<bool> stopping_{false};
  std::thread arena_thread_;
  bool accept_failing_ = false;  // AcceptLoop's own: logged once per run of failures
  std::thread sweep_thread_;
  std::thread nvme_thread_;
  bool shut_down_ = false;
  bool holds_lock_ = false;        // the socket's lock is ours (another daemon's is never unlinked)
  bool started_ = false;           // Start() completed: a refused start cleans up after itself
  bool created_nvme_dir_ = false;  // Start() made the default NVMe directory
  bool created_socket_dir_ = false;  // PrepareSocketDir() made the socket's directory
};

}  // namespace kvtier
