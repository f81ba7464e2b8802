// Internals of the client SDK shared by its source files (client.cc, load.cc, store.cc):
// the calls on a connection (connection.h) and Client::Impl, which dials, keeps and closes
// the connection and releases leases through a Releaser (releaser.h).
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

#include "connection.h"
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
#include "releaser.h"
#include "ring_client.h"
#include "session_stream.h"

namespace kvtier::client_internal {

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
    tokens.push_back(client_internal::SessionTokenInterceptors(c->session_token));
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
