// The client's Session stream with kvtierd (SessionHello, SessionOpened), and the interceptor
// that sends the session's token with every other call on the connection's channel.
// Not installed; not for engines.
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/client_interceptor.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

#include "kvtier/status.h"
#include "kvtier/v1/kvtier.grpc.pb.h"

namespace kvtier::client_internal {

using Clock = std::chrono::steady_clock;

// The client's end of the Session stream. Lives until OnDone.
class SessionStream final : public grpc::ClientBidiReactor<v1::SessionHello, v1::SessionOpened> {
 public:
  // Starts the stream on `stub` with a hello naming `name` and this process.
  SessionStream(v1::KvCache::Stub* stub, const std::string& name);

  // Waits for SessionOpened until `deadline`. Errors: UNAVAILABLE.
  Result<v1::SessionOpened> WaitOpened(Clock::time_point deadline);
  bool alive() const { return alive_.load(); }

  // Tells kvtierd that this client writes no more into its reservations (so
  // their slots are freed at once when the session ends) and waits until
  // `deadline` for its acknowledgement. Returns whether it came.
  bool SayClosing(Clock::time_point deadline);

  // Cancels the stream and waits for OnDone. Then `this` may be deleted.
  void Cancel();

  void OnWriteDone(bool ok) override;
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& s) override;

 private:
  grpc::ClientContext ctx_;
  v1::SessionHello hello_;
  v1::SessionHello closing_;
  v1::SessionOpened opened_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool got_opened_ = false;
  bool closing_acked_ = false;
  bool hello_written_ = false;  // the first write completed (OnWriteDone)
  bool done_ = false;
  std::string end_reason_;
  v1::SessionOpened opened_copy_;
  std::atomic<bool> alive_{true};
};

// Adds `token` (SessionOpened.session_token, written once the session opens) to every call on
// a channel built with it; the Session call itself goes before it is known.
std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface> SessionTokenInterceptors(
    std::shared_ptr<const std::string> token);

}  // namespace kvtier::client_internal
