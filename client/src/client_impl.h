// Internals of the client SDK shared by its source files (client.cc,
// chunk_lease.cc, chunk_reservation.cc): the connection to kvtierd (channel,
// Session stream, mapped arena), the lease releaser and Client::Impl.
// Not installed; not for engines.
#pragma once

#include <grpcpp/create_channel_posix.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/client_interceptor.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "daemon_socket.h"
#include "kvtier/arena.h"
#include "kvtier/client.h"
#include "kvtier/fd_passing.h"
#include "kvtier/proto/convert.h"
#include "kvtier/proto/status_mapping.h"
#include "kvtier/proto/transport_args.h"
#include "kvtier/request_id.h"
#include "kvtier/sanitizers.h"
#include "kvtier/socket_path.h"
#include "kvtier/v1/kvtier.grpc.pb.h"
#include "ring_client.h"

namespace kvtier::client_internal {

using Clock = std::chrono::steady_clock;

// The client's end of the Session stream. Lives until OnDone.
class SessionStream final : public grpc::ClientBidiReactor<v1::SessionHello, v1::SessionOpened> {
 public:
  SessionStream(v1::KvCache::Stub* stub, const std::string& name) {
    hello_.set_client_name(name);
    hello_.set_pid(static_cast<uint32_t>(getpid()));
    stub->async()->Session(&ctx_, this);
    StartWrite(&hello_);
    StartRead(&opened_);
    KVTIER_TSAN_RELEASE(this);  // gRPC runs the reactions below after StartCall
    StartCall();
  }

  // Waits for SessionOpened until `deadline`. Errors: UNAVAILABLE.
  Result<v1::SessionOpened> WaitOpened(Clock::time_point deadline) {
    std::unique_lock lock(mu_);
    if (!cv_.wait_until(lock, deadline, [&] { return got_opened_ || done_; })) {
      return Status::Unavailable("no SessionOpened from the daemon before the deadline");
    }
    if (!got_opened_) return Status::Unavailable("session stream ended: " + end_reason_);
    return opened_copy_;
  }
  bool alive() const { return alive_.load(); }

  // Tells kvtierd that this client writes no more into its reservations (so
  // their slots are freed at once when the session ends) and waits until
  // `deadline` for its acknowledgement. Returns whether it came.
  bool SayClosing(Clock::time_point deadline) {
    {
      // One write at a time: the hello's must have completed.
      std::unique_lock lock(mu_);
      if (!cv_.wait_until(lock, deadline,
                          [&] { return (got_opened_ && hello_written_) || done_; }) ||
          done_) {
        return false;
      }
    }
    closing_.set_closing(true);
    StartWrite(&closing_);
    std::unique_lock lock(mu_);
    return cv_.wait_until(lock, deadline, [&] { return closing_acked_ || done_; }) &&
           closing_acked_;
  }

  // Cancels the stream and waits for OnDone. Then `this` may be deleted.
  void Cancel() {
    ctx_.TryCancel();
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return done_; });
  }

  void OnWriteDone(bool /*ok*/) override {
    KVTIER_TSAN_ACQUIRE(this);
    {
      std::lock_guard lock(mu_);
      hello_written_ = true;
    }
    cv_.notify_all();
  }
  void OnReadDone(bool ok) override {
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
  void OnDone(const grpc::Status& s) override {
    KVTIER_TSAN_ACQUIRE(this);
    alive_.store(false);
    {
      std::lock_guard lock(mu_);
      done_ = true;
      end_reason_ = s.error_message().empty() ? "closed" : s.error_message();
    }
    cv_.notify_all();
  }

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
               std::chrono::milliseconds deadline) {
    // On the control ring, behind this thread's Lookups and ahead of its next.
    if (conn->ring && conn->alive() && conn->ring->ReleaseRead(lease_id)) return;
    v1::ReleaseReadRequest req;
    req.set_session_id(conn->session_id);
    req.set_lease_id(lease_id);
    // A failed release is not the engine's problem: the session or TTL ends the lease.
    Send<v1::ReleaseReadResponse>(std::move(conn), std::move(req), deadline,
                                  [](auto* async, auto... args) { async->ReleaseRead(args...); });
  }

  // Over gRPC: a reservation whose CommitWrite got no answer may still be
  // waiting in the daemon for that commit (a daemon stopped or slow past the
  // deadline), and would hold its keys until its TTL. If the commit did run,
  // the abort finds the reservation gone.
  void Abort(std::shared_ptr<Connection> conn, uint64_t reservation_id,
             std::chrono::milliseconds deadline) {
    v1::AbortWriteRequest req;
    req.set_session_id(conn->session_id);
    req.set_reservation_id(reservation_id);
    Send<v1::AbortWriteResponse>(std::move(conn), std::move(req), deadline,
                                 [](auto* async, auto... args) { async->AbortWrite(args...); });
  }

  // `drop_pending`: cancel the calls in flight (their session is about to
  // end, which ends their leases and reservations) instead of waiting.
  void Stop(bool drop_pending = false) {
    std::vector<std::shared_ptr<CallBase>> cancel;
    {
      std::lock_guard lock(mu_);
      stopped_ = true;
      if (drop_pending) {
        for (auto& entry : in_flight_) cancel.push_back(entry.second);
      }
    }
    // Outside mu_: a cancelled call's callback may run on this thread, in TryCancel.
    for (auto& call : cancel) call->ctx.TryCancel();
    cancel.clear();
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

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
            Start start) {
    auto owned = std::make_shared<Call<Request, Response>>();
    auto* call = owned.get();
    call->conn = std::move(conn);
    call->req = std::move(req);
    call->ctx.set_deadline(std::chrono::system_clock::now() + deadline);
    {
      std::lock_guard lock(mu_);
      if (stopped_) return;  // the session's end ends it
      if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
      in_flight_.emplace(call, std::move(owned));
    }
    start(call->conn->stub->async(), &call->ctx, &call->req, &call->resp,
          std::function<void(grpc::Status)>([this, call](grpc::Status) {
            std::lock_guard lock(mu_);
            auto it = in_flight_.find(call);
            finished_.push_back(std::move(it->second));
            in_flight_.erase(it);
            cv_.notify_one();
          }));
  }

  void Loop() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return !finished_.empty() || (stopped_ && in_flight_.empty()); });
      std::vector<std::shared_ptr<CallBase>> done;
      done.swap(finished_);
      const bool last = stopped_ && in_flight_.empty();
      lock.unlock();
      done.clear();  // the connections' last references may go here, on this thread
      lock.lock();
      if (last && finished_.empty()) return;
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<CallBase*, std::shared_ptr<CallBase>> in_flight_;  // GUARDED_BY(mu_)
  std::vector<std::shared_ptr<CallBase>> finished_;                     // GUARDED_BY(mu_)
  bool stopped_ = false;                                                // GUARDED_BY(mu_)
  std::thread thread_;
};

// Lends this thread's reusable buffer to a LookupRequest's `tokens` for one
// RPC. A long prompt's ids (512 KiB for 128K tokens) would otherwise be a fresh
// allocation per call, which glibc hands back to the kernel on free and faults
// in again on the next call: measured, half of a 128K-token lookup's latency.
template <typename Request>
class LentTokens {
 public:
  LentTokens(Request& req, std::span<const int32_t> tokens) : req_(req) {
    std::string* buf = spare_ ? spare_.release() : new std::string;
    buf->assign(reinterpret_cast<const char*>(tokens.data()), tokens.size_bytes());
    req_.set_allocated_tokens(buf);
  }
  ~LentTokens() {
    std::unique_ptr<std::string> buf(req_.release_tokens());
    if (buf && buf->capacity() <= kMaxKeptBytes) spare_ = std::move(buf);
  }
  LentTokens(const LentTokens&) = delete;
  LentTokens& operator=(const LentTokens&) = delete;

 private:
  static constexpr size_t kMaxKeptBytes = 16 << 20;  // 4M tokens
  static thread_local std::unique_ptr<std::string> spare_;
  Request& req_;
};

template <typename Request>
thread_local std::unique_ptr<std::string> LentTokens<Request>::spare_;

// Runs `req` (its tokens unset) with `tokens` as a Lookup by `deadline`: on
// the control ring when `c` has one that takes it, else over gRPC.
inline Status CallLookup(Connection& c, const NamespaceHandle& ns, Clock::time_point deadline,
                         v1::LookupRequest& req, std::span<const int32_t> tokens,
                         v1::LookupResponse* resp) {
  if (c.ring) {
    const RingClient::LookupArgs args{&ns.id,
                                      tokens,
                                      ns.spec.chunk_tokens,
                                      req.acquire(),
                                      req.hbm(),
                                      req.max_chunks(),
                                      req.prefetch_ticket(),
                                      req.request_id(),
                                      req.first_chunk(),
                                      req.adopt_ticket()};
    if (auto st = c.ring->Lookup(
            args, deadline, [&c] { return c.alive(); }, resp)) {
      return *std::move(st);
    }
  }
  CallContext ctx(c, deadline);
  LentTokens lent(req, tokens);
  return FromGrpcStatus(c.stub->Lookup(ctx.get(), req, resp));
}

// Runs a unary call by `deadline`: op `op` on the control ring when `c` has
// one that takes it, else `grpc(context, req, resp)` (the stub's method).
template <typename Request, typename Response, typename Grpc>
Status CallUnary(Connection& c, RingOp op, Clock::time_point deadline, const Request& req,
                 Response* resp, Grpc grpc) {
  if (c.ring) {
    if (auto st = c.ring->Call(
            op, req, deadline, [&c] { return c.alive(); }, resp)) {
      return *std::move(st);
    }
  }
  CallContext ctx(c, deadline);
  return FromGrpcStatus(grpc(ctx.get(), req, resp));
}

inline v1::LookupRequest MakeLookup(const Connection& c, const NamespaceHandle& ns, bool acquire) {
  v1::LookupRequest req;
  req.set_session_id(c.session_id);
  req.set_epoch(c.epoch);
  req.set_namespace_id(ns.id.ToBytes());
  req.set_acquire(acquire);
  return req;
}

// Before a Load with `ticket`: waits as its policy says (polling the daemon),
// and returns whether the ticket can be handed to the Lookup.
bool WaitForPrefetch(Client& client, const PrefetchTicket& ticket, uint64_t session_id);

}  // namespace kvtier::client_internal

namespace kvtier {

using client_internal::BreaksConnection;
using client_internal::CallContext;
using client_internal::CallUnary;
using client_internal::Clock;
using client_internal::Connection;
using client_internal::LentTokens;
using client_internal::MakeLookup;
using client_internal::Releaser;
using client_internal::SessionStream;
using client_internal::SetDeadline;
using client_internal::WaitForPrefetch;

class Client::Impl {
 public:
  explicit Impl(const ClientOptions& o) : options_(o) {
    if (options_.socket_path.empty()) options_.socket_path = DefaultSocketPath();
    if (const char* ring = std::getenv("KVTIER_CONTROL_RING"); ring != nullptr) {
      std::string v(ring);  // any case: OFF, False
      for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (v == "0" || v == "false" || v == "off" || v == "no") {
        options_.control_ring = false;
      } else if (v != "1" && v != "true" && v != "on" && v != "yes") {
        spdlog::warn(
            "kvtier client: KVTIER_CONTROL_RING='{}' is neither off (0, false, off, no) "
            "nor on (1, true, on, yes); the control ring stays {}",
            ring, options_.control_ring ? "on" : "off");
      }
    }
  }

  const ClientOptions& options() const { return options_; }

  // The deadline of an SDK call starting now: every step of the call (connecting,
  // registering its namespace, its RPCs) fits in it.
  Clock::time_point CallDeadline() const { return Clock::now() + options_.deadline; }

  // A live connection, reconnecting when the last one broke and the
  // reconnect interval has passed. The connection attempt runs outside mu_:
  // other callers wait for it only until their own `deadline`. Errors: why
  // there is none (fail open).
  Result<std::shared_ptr<Connection>> Get(Clock::time_point deadline) {
    std::unique_lock lock(mu_);
    for (;;) {
      if (closed_) return Status::FailedPrecondition("client is closed");
      if (conn_ && conn_->alive()) return conn_;
      if (!dialing_) break;
      if (!dial_done_.wait_until(lock, deadline, [&] { return !dialing_; })) {
        return Status::DeadlineExceeded("still connecting to kvtierd at " + options_.socket_path);
      }
    }
    const auto now = Clock::now();
    if (now - last_attempt_ < options_.reconnect_interval) {
      return Status::Unavailable("not connected to kvtierd (" + last_error_ + ")");
    }
    last_attempt_ = now;
    dialing_ = true;
    std::shared_ptr<Arena> arena = arena_;
    lock.unlock();
    auto fresh = Dial(deadline, arena);
    lock.lock();
    dialing_ = false;
    dial_done_.notify_all();
    if (!fresh.ok()) {
      last_error_ = fresh.status().message();
      conn_.reset();
      return fresh.status();
    }
    if (closed_) return Status::FailedPrecondition("client is closed");
    arena_ = (*fresh)->arena;
    conn_ = std::move(fresh).value();
    return conn_;
  }

  // Marks `conn` broken when `st` says the daemon lost our session; forgets
  // that `ns` is registered when the daemon says it does not know it.
  void Report(const std::shared_ptr<Connection>& conn, const Status& st,
              const NamespaceId* ns = nullptr) {
    if (st.ok()) return;
    if (BreaksConnection(st)) {
      if (!conn->broken.exchange(true)) {
        spdlog::info("kvtier client: connection lost ({}); will reconnect", st.ToString());
      }
    } else if (st.code() == StatusCode::kNotFound && ns != nullptr) {
      std::lock_guard lock(conn->registered_mu);
      conn->registered.erase(*ns);
    }
  }

  // A live connection on which `ns` is registered (registering it first when
  // needed), by `deadline`. Errors: why not, for the caller to fail open with.
  Result<std::shared_ptr<Connection>> GetFor(const NamespaceHandle& ns,
                                             Clock::time_point deadline) {
    auto conn = Get(deadline);
    if (!conn.ok()) return conn.status();
    KVTIER_RETURN_IF_ERROR(EnsureRegistered(*conn, ns.spec, ns.id, deadline));
    return conn;
  }

  Status EnsureRegistered(const std::shared_ptr<Connection>& conn, const NamespaceSpec& spec,
                          const NamespaceId& id, Clock::time_point deadline) {
    {
      std::lock_guard lock(conn->registered_mu);
      if (conn->registered.count(id) > 0) return Status::Ok();
    }
    Status st = Register(*conn, spec, deadline);
    Report(conn, st);
    if (!st.ok()) return st;
    std::lock_guard lock(conn->registered_mu);
    conn->registered.insert(id);
    return Status::Ok();
  }

  void AddNamespace(const NamespaceHandle& ns) {
    std::lock_guard lock(mu_);
    namespaces_[ns.id] = ns.spec;
  }
  void RemoveNamespace(const NamespaceId& id) {
    std::lock_guard lock(mu_);
    namespaces_.erase(id);
  }
  bool Knows(const NamespaceId& id) {
    std::lock_guard lock(mu_);
    return namespaces_.count(id) > 0;
  }

  // Registers `spec` on `conn`. Errors from the daemon.
  Status Register(Connection& conn, const NamespaceSpec& spec, Clock::time_point deadline) {
    v1::OpenNamespaceRequest req;
    req.set_session_id(conn.session_id);
    *req.mutable_spec() = ToProto(spec);
    v1::OpenNamespaceResponse resp;
    CallContext ctx(conn, deadline);
    return FromGrpcStatus(conn.stub->OpenNamespace(ctx.get(), req, &resp));
  }

  // Pending lease releases and aborts are dropped (ending the session ends
  // those leases and reservations in the daemon), so that a daemon that does
  // not answer cannot hold it up.
  void Close() {
    releaser_.Stop(/*drop_pending=*/true);
    std::shared_ptr<Connection> last;
    {
      std::lock_guard lock(mu_);
      last = std::move(conn_);
      closed_ = true;
    }
    // Without it kvtierd keeps this session's reservations' slots until the process exits.
    if (last && last->alive()) last->session->SayClosing(Clock::now() + options_.deadline);
  }

  void ReleaseLater(std::shared_ptr<Connection> conn, uint64_t lease_id) {
    releaser_.Release(std::move(conn), lease_id, options_.deadline);
  }
  // Within `ttl`: the reservation ends by then anyway.
  void AbortLater(std::shared_ptr<Connection> conn, uint64_t reservation_id,
                  std::chrono::milliseconds ttl) {
    releaser_.Abort(std::move(conn), reservation_id, ttl);
  }
  bool connected() {
    std::lock_guard lock(mu_);
    return conn_ && conn_->alive();
  }

 private:
  // A new connection by `deadline`, mapping the arena unless `arena` (the one
  // mapped before) has the session's epoch. REQUIRES: mu_ not held.
  Result<std::shared_ptr<Connection>> Dial(Clock::time_point deadline,
                                           const std::shared_ptr<Arena>& arena) {
    auto c = std::make_shared<Connection>();
    grpc::ChannelArguments args;
    for (const auto& [name, value] : TransportArgs()) args.SetInt(name, value);
    std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> tokens;
    tokens.push_back(
        std::make_unique<client_internal::SessionTokenInterceptorFactory>(c->session_token));
    int grpc_fd = -1;
    auto socket = client_internal::DaemonSocket::Connect(options_.socket_path, deadline, &grpc_fd);
    if (!socket.ok()) return socket.status();
    c->socket = std::move(socket).value();
    c->channel = grpc::experimental::CreateCustomInsecureChannelWithInterceptorsFromFd(
        "unix:" + options_.socket_path, grpc_fd, args, std::move(tokens));
    c->stub = v1::KvCache::NewStub(c->channel);
    c->session = std::make_unique<SessionStream>(c->stub.get(), options_.client_name);
    auto opened = c->session->WaitOpened(deadline);
    if (!opened.ok()) return opened.status();
    c->session_id = opened->session_id();
    *c->session_token = opened->session_token();
    c->epoch = opened->epoch();
    if (opened->has_hbm()) {
      const v1::HbmPool& pool = opened->hbm();
      c->hbm = HbmPoolInfo{pool.ipc_handle(), pool.pool_bytes(), pool.backend(), pool.device(),
                           c->epoch};
    }
    if (arena && arena->epoch() == c->epoch) {
      c->arena = arena;
    } else {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      auto got = ReceiveArenaFd(ArenaSocketPath(options_.socket_path),
                                static_cast<int>(std::max<int64_t>(left.count(), 1)));
      if (!got.ok()) return got.status();
      auto [msg, fd] = *got;
      if (msg.epoch != c->epoch) {
        close(fd);
        return Status::Unavailable("arena epoch differs from the session's (daemon restarting)");
      }
      auto mapped = Arena::Map(fd, msg.arena_bytes, msg.epoch);
      if (!mapped.ok()) return mapped.status();
      c->arena = std::shared_ptr<Arena>(std::move(mapped).value());
      spdlog::debug("kvtier client: mapped arena epoch {:016x} ({} bytes)", msg.epoch,
                    msg.arena_bytes);
    }
    if (options_.control_ring) {  // without one, calls go over gRPC
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      auto fd = RequestRingFd(options_.socket_path, c->session_id, *c->session_token,
                              static_cast<int>(std::max<int64_t>(left.count(), 1)));
      auto ring = fd.ok() ? RingMemory::Map(*fd, c->session_id) : Result<RingMemory>(fd.status());
      if (ring.ok()) {
        c->ring = std::make_unique<client_internal::RingClient>(std::move(ring).value());
      } else {
        spdlog::info("kvtier client: no control ring ({}); Lookups go over gRPC",
                     ring.status().ToString());
      }
    }
    return c;  // namespaces are registered on first use (EnsureRegistered)
  }

  ClientOptions options_;
  std::mutex mu_;
  std::shared_ptr<Connection> conn_;                                         // GUARDED_BY(mu_)
  std::shared_ptr<Arena> arena_;                                             // GUARDED_BY(mu_)
  std::unordered_map<NamespaceId, NamespaceSpec, ChunkKeyHash> namespaces_;  // GUARDED_BY(mu_)
  Clock::time_point last_attempt_{};                                         // GUARDED_BY(mu_)
  std::string last_error_ = "never connected";                               // GUARDED_BY(mu_)
  bool closed_ = false;                                                      // GUARDED_BY(mu_)
  bool dialing_ = false;  // a thread is connecting, outside mu_   // GUARDED_BY(mu_)
  std::condition_variable dial_done_;
  Releaser releaser_;
};

}  // namespace kvtier
