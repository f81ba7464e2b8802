// The client's Session stream and its token interceptor (session_stream.h).
#include "session_stream.h"

#include <unistd.h>

#include "kvtier/proto/transport_args.h"
#include "kvtier/sanitizers.h"

namespace kvtier::client_internal {

SessionStream::SessionStream(v1::KvCache::Stub* stub, const std::string& name) {
  hello_.set_client_name(name);
  hello_.set_pid(static_cast<uint32_t>(getpid()));
  stub->async()->Session(&ctx_, this);
  StartWrite(&hello_);
  StartRead(&opened_);
  KVTIER_TSAN_RELEASE(this);  // gRPC runs the reactions below after StartCall
  StartCall();
}

Result<v1::SessionOpened> SessionStream::WaitOpened(Clock::time_point deadline) {
  std::unique_lock lock(mu_);
  if (!cv_.wait_until(lock, deadline, [&] { return got_opened_ || done_; })) {
    return Status::Unavailable("no SessionOpened from the daemon before the deadline");
  }
  if (!got_opened_) return Status::Unavailable("session stream ended: " + end_reason_);
  return opened_copy_;
}

bool SessionStream::SayClosing(Clock::time_point deadline) {
  {
    // One write at a time: the hello's must have completed.
    std::unique_lock lock(mu_);
    if (!cv_.wait_until(lock, deadline, [&] { return (got_opened_ && hello_written_) || done_; }) ||
        done_) {
      return false;
    }
  }
  closing_.set_closing(true);
  StartWrite(&closing_);
  std::unique_lock lock(mu_);
  return cv_.wait_until(lock, deadline, [&] { return closing_acked_ || done_; }) && closing_acked_;
}

void SessionStream::Cancel() {
  ctx_.TryCancel();
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return done_; });
}

void SessionStream::OnWriteDone(bool /*ok*/) {
  KVTIER_TSAN_ACQUIRE(this);
  {
    std::lock_guard lock(mu_);
    hello_written_ = true;
  }
  cv_.notify_all();
}

void SessionStream::OnReadDone(bool ok) {
  KVTIER_TSAN_ACQUIRE(this);
  if (!ok) return;  // the stream ended; OnDone follows
  {
    std::lock_guard lock(mu_);
    if (!got_opened_) {
      opened_copy_ = opened_;
      got_opened_ = true;
    } else {
      closing_acked_ = true;  // the only other SessionOpened: SayClosing's answer
    }
  }
  cv_.notify_all();
  StartRead(&opened_);  // keep a read pending to see the stream end
}

void SessionStream::OnDone(const grpc::Status& s) {
  KVTIER_TSAN_ACQUIRE(this);
  alive_.store(false);
  {
    std::lock_guard lock(mu_);
    done_ = true;
    end_reason_ = s.error_message().empty() ? "closed" : s.error_message();
  }
  cv_.notify_all();
}

namespace {

// Adds the session's token (SessionOpened.session_token) to every call on a
// connection's channel; the Session call itself goes before it is known.
class SessionTokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit SessionTokenInterceptor(std::shared_ptr<const std::string> token)
      : token_(std::move(token)) {}
  // gRPC creates the interceptor on the caller's thread and runs and destroys it on its own.
  ~SessionTokenInterceptor() override { KVTIER_TSAN_ACQUIRE(this); }
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    KVTIER_TSAN_ACQUIRE(this);
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA) &&
        !token_->empty()) {
      methods->GetSendInitialMetadata()->emplace(kSessionTokenKey, *token_);
    }
    methods->Proceed();
  }

 private:
  std::shared_ptr<const std::string> token_;
};

class SessionTokenInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit SessionTokenInterceptorFactory(std::shared_ptr<const std::string> token)
      : token_(std::move(token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* /*info*/) override {
    auto* interceptor = new SessionTokenInterceptor(token_);
    KVTIER_TSAN_RELEASE(interceptor);
    return interceptor;
  }

 private:
  std::shared_ptr<const std::string> token_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface> SessionTokenInterceptors(
    std::shared_ptr<const std::string> token) {
  return std::make_unique<SessionTokenInterceptorFactory>(std::move(token));
}

}  // namespace kvtier::client_internal
