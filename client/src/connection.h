// One live connection to kvtierd (socket, channel, Session stream, control ring, the arena it
// maps) and the context of a blocking call on it. Not installed; not for engines.
#pragma once

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>

#include "daemon_socket.h"
#include "kvtier/arena.h"
#include "kvtier/client.h"
#include "kvtier/v1/kvtier.grpc.pb.h"
#include "ring_client.h"
#include "session_stream.h"

namespace kvtier::client_internal {

// One live connection: socket, channel, session and the arena it maps.
struct Connection {
  std::shared_ptr<DaemonSocket> socket;  // the channel is built on a duplicate of it
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::KvCache::Stub> stub;
  std::unique_ptr<SessionStream> session;
  std::shared_ptr<Arena> arena;
  std::unique_ptr<RingClient> ring;  // the session's control ring; null: gRPC only
  std::optional<HbmPoolInfo> hbm;    // the daemon's HBM pool, from SessionOpened
  uint64_t session_id = 0;
  // Written once, when the session opens and before any other call on the
  // channel; the channel's interceptor sends it with every call.
  std::shared_ptr<std::string> session_token = std::make_shared<std::string>();
  uint64_t epoch = 0;
  std::atomic<bool> broken{false};
  std::mutex registered_mu;
  std::unordered_set<NamespaceId, ChunkKeyHash> registered;  // GUARDED_BY(registered_mu)

  bool alive() const { return !broken.load() && session->alive(); }
  ~Connection() {
    // Shut down first: a transport stuck on a daemon that does not read then
    // fails at once, so the session's cancel (and gRPC's teardown) cannot hang.
    if (socket) socket->Shutdown();
    if (session) session->Cancel();
  }
};

// Sets `ctx`'s deadline to the steady-clock `deadline` (gRPC takes system time).
inline void SetDeadline(grpc::ClientContext& ctx, Clock::time_point deadline) {
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::max<Clock::duration>(deadline - Clock::now(), Clock::duration::zero()));
}

// A blocking call's context on `c`: gRPC's deadline, and the watchdog's hold
// on the call (CallWatchdog) for when gRPC's deadline does not fire.
class CallContext {
 public:
  CallContext(const Connection& c, Clock::time_point deadline) : watch_(c.socket, deadline) {
    SetDeadline(ctx_, deadline);
  }
  grpc::ClientContext* get() { return &ctx_; }

 private:
  grpc::ClientContext ctx_;
  CallWatchdog::Watch watch_;
};

inline bool BreaksConnection(const Status& st) {
  switch (st.code()) {
    case StatusCode::kUnavailable:
    case StatusCode::kFailedPrecondition:  // unknown session, stale epoch
    case StatusCode::kCancelled:
      return true;
    default:
      return false;
  }
}

}  // namespace kvtier::client_internal
