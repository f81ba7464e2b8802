// The client's lease releases and reservation aborts, sent without waiting (Releaser).
// Not installed; not for engines.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "connection.h"

namespace kvtier::client_internal {

// Ends leases (and reservations) off the caller's path: Release sends the
// ReleaseRead at once, from the caller's thread, and returns without waiting
// for the answer. A release that waited for another thread (or behind earlier
// releases) kept its chunks pinned meanwhile: loads from several threads, or a
// scheduler slow to run that thread, filled the arena with released leases,
// and later loads found no room to promote into. The calls finish on gRPC's
// threads; this class's own thread only frees them, so that a connection whose
// last reference a call holds is torn down there, not on a gRPC callback
// thread. Stop() waits for the calls in flight (each within its deadline; with
// `drop_pending`, cancelled).
class Releaser {
 public:
  ~Releaser() { Stop(); }

  void Release(std::shared_ptr<Connection> conn, uint64_t lease_id,
               std::chrono::milliseconds deadline);

  // Over gRPC: a reservation whose CommitWrite got no answer may still be
  // waiting in the daemon for that commit (a daemon stopped or slow past the
  // deadline), and would hold its keys until its TTL. If the commit did run,
  // the abort finds the reservation gone.
  void Abort(std::shared_ptr<Connection> conn, uint64_t reservation_id,
             std::chrono::milliseconds deadline);

  // `drop_pending`: cancel the calls in flight (their session is about to
  // end, which ends their leases and reservations) instead of waiting.
  void Stop(bool drop_pending = false);

 private:
  struct CallBase {
    virtual ~CallBase() = default;
    std::shared_ptr<Connection> conn;
    grpc::ClientContext ctx;
  };
  template <typename Request, typename Response>
  struct Call : CallBase {
    Request req;
    Response resp;
  };

  // Starts `req` with `start(async_stub, ctx, req, resp, on_done)`; nobody waits for it.
  template <typename Response, typename Request, typename Start>
  void Send(std::shared_ptr<Connection> conn, Request req, std::chrono::milliseconds deadline,
            Start start);
  // Hands a finished call to the thread that frees it.
  void Finished(CallBase* call);
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<CallBase*, std::shared_ptr<CallBase>> in_flight_;  // GUARDED_BY(mu_)
  std::vector<std::shared_ptr<CallBase>> finished_;                     // GUARDED_BY(mu_)
  bool stopped_ = false;                                                // GUARDED_BY(mu_)
  std::thread thread_;
};

}  // namespace kvtier::client_internal
