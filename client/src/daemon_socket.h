// The client's connection socket to kvtierd, and the watchdog that holds every
// SDK call to its deadline. Not installed; not for engines.
//
// gRPC's own deadline does not fire while the transport cannot finish a write
// (grpc/grpc#28434): with kvtierd stopped (SIGSTOP) and the socket's buffers
// full, a call with a 100 ms deadline waited for minutes, and the process's
// exit after it. So the client makes the socket itself (DaemonSocket), hands
// gRPC a duplicate to build the channel on, and keeps its own end: a call still
// running `kGrace` past its deadline gets the socket shut down (CallWatchdog),
// which fails every call on that channel at once (UNAVAILABLE, so the client
// reconnects), and a connection's end shuts it down too, so that nothing of it
// lingers in gRPC (a dial that failed against a stopped daemon used to leave
// its socket open in gRPC, one per attempt).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "kvtier/status.h"

namespace kvtier::client_internal {

class DaemonSocket {
 public:
  using Clock = std::chrono::steady_clock;

  // Connects to the Unix socket at `path` by `deadline` (a daemon that does not
  // accept, its backlog full, times out then). Returns the socket and, in
  // `*grpc_fd`, a non-blocking duplicate of it for gRPC to own. Errors:
  // UNAVAILABLE naming the path and why.
  static Result<std::shared_ptr<DaemonSocket>> Connect(const std::string& path,
                                                       Clock::time_point deadline, int* grpc_fd);
  ~DaemonSocket();
  DaemonSocket(const DaemonSocket&) = delete;
  DaemonSocket& operator=(const DaemonSocket&) = delete;

  // shutdown(2) both ways: every read and write on the socket, gRPC's
  // included, fails from now on. Idempotent; thread-safe.
  void Shutdown();

 private:
  explicit DaemonSocket(int fd) : fd_(fd) {}
  const int fd_;
};

// One process-wide thread that shuts down the socket of a call running past
// its deadline + kGrace. Thread-safe.
class CallWatchdog {
 public:
  using Clock = std::chrono::steady_clock;
  // How long past its deadline a call may run before its socket is shut down:
  // gRPC's deadline normally ends it first.
  static constexpr std::chrono::milliseconds kGrace{100};

  // Watches one call from its construction to its destruction.
  class Watch {
   public:
    Watch(std::shared_ptr<DaemonSocket> socket, Clock::time_point deadline);
    ~Watch();
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;

   private:
    uint64_t id_ = 0;
  };

 private:
  struct Entry {
    std::shared_ptr<DaemonSocket> socket;
    Clock::time_point due;  // deadline + kGrace
  };
  static CallWatchdog& Instance();
  uint64_t Add(std::shared_ptr<DaemonSocket> socket, Clock::time_point deadline);
  void Remove(uint64_t id);
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<uint64_t, Entry> calls_;  // GUARDED_BY(mu_)
  uint64_t next_id_ = 1;                       // GUARDED_BY(mu_)
  bool started_ = false;                       // GUARDED_BY(mu_)
  // When Loop wakes next (max: when a call is added; min: it is awake).
  Clock::time_point wake_at_ = Clock::time_point::max();  // GUARDED_BY(mu_)
};

}  // namespace kvtier::client_internal
