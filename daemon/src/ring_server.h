// Serves the control ring (kvtier/control_ring.h): hands each session its
// ring over `<socket>.ring` and answers what the session's client submits.
//
// One thread accepts and hands out rings. A few poller threads (half the
// cores; one more per 127 rings past that) serve them: each takes its rings'
// submissions in order, passes them to CacheCore as the gRPC service would,
// spins 50 us after its last work, then sleeps on all its rings' futexes at
// once (futex_waitv). A thread per ring would put more spinners than cores on
// a small machine, where they take turns burning each other's time. A Lookup
// that promotes from NVMe is answered later by the core's I/O worker.
// ReserveWrite, CommitWrite, AbortWrite and PrefetchStatus run off the pollers,
// on workers: a ReserveWrite may wait for the NVMe writer (write-through
// backpressure), and the pollers' other rings must not wait with it. That wait
// delays no other call: ReserveWrites have workers of their own, each running
// at most one session's (a session's next waits for it, another session's
// takes another worker), and CommitWrite, AbortWrite and PrefetchStatus,
// which never wait, run on two more.
// A ring whose queue indexes make no sense is no longer served (its client's
// calls time out and fail open, as with a daemon that stopped reading); a
// ring whose session ended is torn down within 100 ms.
//
// Thread-safety: Stop() from one thread; the rest is internal.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kvtier/control_ring.h"
#include "kvtier/daemon/cache_core.h"
#include "peer_listener.h"

namespace kvtier {

class RingServer {
 public:
  // Takes `listen_fd` (a listening Unix socket at RingSocketPath).
  RingServer(CacheCore& core, int listen_fd, PeerPolicy peers);
  ~RingServer();
  RingServer(const RingServer&) = delete;
  RingServer& operator=(const RingServer&) = delete;

  // Stops accepting and serving (idempotent). Answers still owed by the
  // core's I/O workers are written into rings that stay mapped until then.
  void Stop();

  struct Ring;
  struct Poller;

 private:
  void AcceptLoop();
  // Answers `conn`, whose `hello` has arrived whole, with its ring or a refusal.
  void Handshake(int conn, const RingHello& hello);
  static void Refuse(int conn, const Status& st);
  // Hands `ring` to the poller with the fewest rings (a new one while there
  // are fewer than kPollers, or when all are full). RESOURCE_EXHAUSTED: no
  // thread for a new poller.
  Status Assign(const std::shared_ptr<Ring>& ring);
  void Poll(Poller& poller);
  // Takes `ring`'s new submissions; true when there were any. A ring whose
  // tail ran away is marked ended.
  bool Serve(const std::shared_ptr<Ring>& ring);
  void Submit(const std::shared_ptr<Ring>& ring, uint32_t slot);
  // Runs ReserveWrite to PrefetchStatus (their v1 messages) and answers.
  void RunMessageOp(const std::shared_ptr<Ring>& ring, uint32_t slot, const RingCall& call,
                    uint64_t session, uint64_t epoch);
  void ReapEnded();

  // Threads running jobs in order, each job for a session (`key`). With
  // `one_per_key`, no two jobs of one session run at once: a worker takes the
  // first job whose session has none running.
  class Workers {
   public:
    Workers(size_t threads, bool one_per_key);
    void Defer(uint64_t key, std::function<void()> job);
    // Runs what is queued, then joins the threads (idempotent).
    void Stop();

   private:
    void Work();
    const bool one_per_key_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::pair<uint64_t, std::function<void()>>> jobs_;  // GUARDED_BY(mu_)
    std::unordered_map<uint64_t, size_t> running_;                 // GUARDED_BY(mu_)
    bool stop_ = false;                                            // GUARDED_BY(mu_)
    std::vector<std::thread> threads_;
  };

  CacheCore& core_;
  const int listen_fd_;
  const PeerPolicy peers_;
  std::atomic<bool> stopping_{false};
  std::thread accept_thread_;
  std::mutex mu_;
  std::unordered_map<uint64_t, std::shared_ptr<Ring>> rings_;  // by session; GUARDED_BY(mu_)
  std::vector<std::unique_ptr<Poller>> pollers_;               // GUARDED_BY(mu_)
  Workers reserves_;                                           // ReserveWrite
  Workers quick_;  // CommitWrite, AbortWrite, PrefetchStatus
};

}  // namespace kvtier
