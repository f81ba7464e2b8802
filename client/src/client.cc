#include "kvtier/client.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <thread>
#include <cstring>
#include <mutex>
#include <unordered_set>

#include "kvtier/arena.h"
#include "kvtier/fd_passing.h"
#include "kvtier/proto/convert.h"
#include "kvtier/proto/status_mapping.h"
#include "kvtier/proto/transport_args.h"
#include "kvtier/socket_path.h"
#include "kvtier/v1/kvtier.grpc.pb.h"

namespace kvtier {
namespace {

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

  // Cancels the stream and waits for OnDone. Then `this` may be deleted.
  void Cancel() {
    ctx_.TryCancel();
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return done_; });
  }

  void OnWriteDone(bool /*ok*/) override {}
  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended; OnDone follows
    {
      std::lock_guard lock(mu_);
      if (!got_opened_) {
        opened_copy_ = opened_;
        got_opened_ = true;
      }
    }
    cv_.notify_all();
    StartRead(&opened_);  // keep a read pending to see the stream end
  }
  void OnDone(const grpc::Status& s) override {
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
  v1::SessionOpened opened_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool got_opened_ = false;
  bool done_ = false;
  std::string end_reason_;
  v1::SessionOpened opened_copy_;
  std::atomic<bool> alive_{true};
};

// One live connection: channel, session and the arena it maps.
struct Connection {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::KvCache::Stub> stub;
  std::unique_ptr<SessionStream> session;
  std::shared_ptr<Arena> arena;
  uint64_t session_id = 0;
  uint64_t epoch = 0;
  std::atomic<bool> broken{false};
  std::mutex registered_mu;
  std::unordered_set<NamespaceId, ChunkKeyHash> registered;  // GUARDED_BY(registered_mu)

  bool alive() const { return !broken.load() && session->alive(); }
  ~Connection() {
    if (session) session->Cancel();
  }
};

bool BreaksConnection(const Status& st) {
  switch (st.code()) {
    case StatusCode::kUnavailable:
    case StatusCode::kFailedPrecondition:  // unknown session, stale epoch
    case StatusCode::kCancelled:
      return true;
    default:
      return false;
  }
}

// Releases leases off the load path: Load hands the lease to this worker and
// returns; the worker makes the (synchronous, deadline-bounded) ReleaseRead
// call. Its own thread, not a gRPC callback thread, so that a connection it
// holds the last reference to is torn down safely. Stop() drains the queue.
class Releaser {
 public:
  ~Releaser() { Stop(); }

  void Enqueue(std::shared_ptr<Connection> conn, uint64_t lease_id,
               std::chrono::milliseconds deadline) {
    std::lock_guard lock(mu_);
    if (stopped_) return;  // the session's end releases it
    queue_.push_back({std::move(conn), lease_id, deadline});
    if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
    cv_.notify_one();
  }

  void Stop() {
    {
      std::lock_guard lock(mu_);
      stopped_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

 private:
  struct Item {
    std::shared_ptr<Connection> conn;
    uint64_t lease_id;
    std::chrono::milliseconds deadline;
  };

  void Loop() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stopped_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopped and drained
      Item item = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      v1::ReleaseReadRequest req;
      req.set_session_id(item.conn->session_id);
      req.set_lease_id(item.lease_id);
      v1::ReleaseReadResponse resp;
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + item.deadline);
      // A failed release is not the engine's problem: the session or TTL ends the lease.
      (void)item.conn->stub->ReleaseRead(&ctx, req, &resp);
      item.conn.reset();
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;  // GUARDED_BY(mu_)
  bool stopped_ = false;    // GUARDED_BY(mu_)
  std::thread thread_;
};

}  // namespace

class Client::Impl {
 public:
  explicit Impl(const ClientOptions& o) : options_(o) {
    if (options_.socket_path.empty()) options_.socket_path = DefaultSocketPath();
  }

  const ClientOptions& options() const { return options_; }

  // A live connection, reconnecting when the last one broke and the
  // reconnect interval has passed. Errors: why there is none (fail open).
  Result<std::shared_ptr<Connection>> Get(std::chrono::milliseconds budget) {
    std::lock_guard lock(mu_);
    if (conn_ && conn_->alive()) return conn_;
    const auto now = Clock::now();
    if (now - last_attempt_ < options_.reconnect_interval) {
      return Status::Unavailable("not connected to kvtierd (" + last_error_ + ")");
    }
    last_attempt_ = now;
    auto fresh = Dial(now + budget);
    if (!fresh.ok()) {
      last_error_ = fresh.status().message();
      conn_.reset();
      return fresh.status();
    }
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
  // needed). Errors: why not, for the caller to fail open with.
  Result<std::shared_ptr<Connection>> GetFor(const NamespaceHandle& ns) {
    auto conn = Get(options_.deadline);
    if (!conn.ok()) return conn.status();
    KVTIER_RETURN_IF_ERROR(EnsureRegistered(*conn, ns.spec, ns.id));
    return conn;
  }

  Status EnsureRegistered(const std::shared_ptr<Connection>& conn, const NamespaceSpec& spec,
                          const NamespaceId& id) {
    {
      std::lock_guard lock(conn->registered_mu);
      if (conn->registered.count(id) > 0) return Status::Ok();
    }
    Status st = Register(*conn, spec, Clock::now() + options_.deadline);
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
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + (deadline - Clock::now()));
    return FromGrpcStatus(conn.stub->OpenNamespace(&ctx, req, &resp));
  }

  void Close() {
    releaser_.Stop();  // pending releases first, while their session is open
    std::lock_guard lock(mu_);
    conn_.reset();
    closed_ = true;
  }

  void ReleaseLater(std::shared_ptr<Connection> conn, uint64_t lease_id) {
    releaser_.Enqueue(std::move(conn), lease_id, options_.deadline);
  }
  bool connected() {
    std::lock_guard lock(mu_);
    return conn_ && conn_->alive();
  }

 private:
  // REQUIRES: mu_ held.
  Result<std::shared_ptr<Connection>> Dial(Clock::time_point deadline) {
    if (closed_) return Status::FailedPrecondition("client is closed");
    auto c = std::make_shared<Connection>();
    grpc::ChannelArguments args;
    for (const auto& [name, value] : TransportArgs()) args.SetInt(name, value);
    c->channel = grpc::CreateCustomChannel("unix:" + options_.socket_path,
                                           grpc::InsecureChannelCredentials(), args);
    c->stub = v1::KvCache::NewStub(c->channel);
    c->session = std::make_unique<SessionStream>(c->stub.get(), options_.client_name);
    auto opened = c->session->WaitOpened(deadline);
    if (!opened.ok()) return opened.status();
    c->session_id = opened->session_id();
    c->epoch = opened->epoch();
    if (arena_ && arena_->epoch() == c->epoch) {
      c->arena = arena_;
    } else {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
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
      arena_ = std::shared_ptr<Arena>(std::move(mapped).value());
      c->arena = arena_;
      spdlog::debug("kvtier client: mapped arena epoch {:016x} ({} bytes)", msg.epoch,
                   msg.arena_bytes);
    }
    return c;  // namespaces are registered on first use (EnsureRegistered)
  }

  ClientOptions options_;
  std::mutex mu_;
  std::shared_ptr<Connection> conn_;                           // GUARDED_BY(mu_)
  std::shared_ptr<Arena> arena_;                               // GUARDED_BY(mu_)
  std::unordered_map<NamespaceId, NamespaceSpec, ChunkKeyHash> namespaces_;  // GUARDED_BY(mu_)
  Clock::time_point last_attempt_{};                           // GUARDED_BY(mu_)
  std::string last_error_ = "never connected";                 // GUARDED_BY(mu_)
  bool closed_ = false;                                        // GUARDED_BY(mu_)
  Releaser releaser_;
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() { Close(); }

Result<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  if (options.deadline.count() <= 0) return Status::InvalidArgument("deadline must be positive");
  if (options.connect_timeout.count() <= 0) {
    return Status::InvalidArgument("connect_timeout must be positive");
  }
  if (options.reconnect_interval.count() < 0) {
    return Status::InvalidArgument("reconnect_interval must not be negative");
  }
  KVTIER_RETURN_IF_ERROR(
      CheckSocketPath(options.socket_path.empty() ? DefaultSocketPath() : options.socket_path));
  std::unique_ptr<Client> client(new Client(std::make_unique<Impl>(options)));
  auto conn = client->impl_->Get(options.connect_timeout);
  if (!conn.ok()) {
    spdlog::warn("kvtier client: kvtierd not reachable at {} ({}); failing open until it is",
                 client->impl_->options().socket_path, conn.status().message());
  }
  return client;
}

bool Client::connected() const { return impl_->connected(); }
void Client::Close() { impl_->Close(); }

Result<NamespaceHandle> Client::OpenNamespace(const NamespaceSpec& spec) {
  KVTIER_RETURN_IF_ERROR(spec.Validate());
  NamespaceHandle ns{spec.Digest(), spec, SlotLayout::For(spec)};
  auto conn = impl_->Get(impl_->options().deadline);
  if (conn.ok()) {
    Status st = impl_->EnsureRegistered(*conn, spec, ns.id);
    // The daemon's refusals of this namespace itself are the caller's to see:
    // a slot larger than the arena, or the daemon's namespace limit.
    if (st.code() == StatusCode::kInvalidArgument ||
        st.code() == StatusCode::kResourceExhausted) {
      return st;
    }
  }
  impl_->AddNamespace(ns);
  return ns;
}

std::vector<ChunkKey> Client::ChunkKeys(const NamespaceHandle& ns,
                                        std::span<const int32_t> tokens) {
  return ComputeChunkKeys(ns.id, tokens, ns.spec.chunk_tokens);
}

namespace {


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

v1::LookupRequest MakeLookup(const Connection& c, const NamespaceHandle& ns, bool acquire) {
  v1::LookupRequest req;
  req.set_session_id(c.session_id);
  req.set_epoch(c.epoch);
  req.set_namespace_id(ns.id.ToBytes());
  req.set_acquire(acquire);
  return req;
}

}  // namespace

Result<LookupResult> Client::Lookup(const NamespaceHandle& ns, std::span<const int32_t> tokens) {
  if (!impl_->Knows(ns.id)) return Status::InvalidArgument("namespace was not opened by this client");
  LookupResult result;
  auto conn = impl_->GetFor(ns);
  if (!conn.ok()) {
    result.fail_open = conn.status();
    return result;
  }
  v1::LookupResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + impl_->options().deadline);
  v1::LookupRequest req = MakeLookup(**conn, ns, /*acquire=*/false);
  LentTokens lent(req, tokens);
  Status st = FromGrpcStatus((*conn)->stub->Lookup(&ctx, req, &resp));
  impl_->Report(*conn, st, &ns.id);
  if (!st.ok()) {
    result.fail_open = st;
    return result;
  }
  result.num_chunks = resp.num_chunks();
  result.cached_tokens = uint64_t{resp.num_chunks()} * ns.spec.chunk_tokens;
  return result;
}

Result<PrefetchTicket> Client::Prefetch(const NamespaceHandle& ns, std::span<const int32_t> tokens,
                                        const PrefetchOptions& options) {
  if (!impl_->Knows(ns.id)) return Status::InvalidArgument("namespace was not opened by this client");
  if (options.deadline.count() < 1 || options.deadline.count() > 600000) {
    return Status::InvalidArgument("PrefetchOptions.deadline " +
                                   std::to_string(options.deadline.count()) +
                                   " ms is outside 1..600000");
  }
  if (options.timeout_base.count() < 0 || options.timeout_per_1k_tokens.count() < 0) {
    return Status::InvalidArgument("PrefetchOptions timeouts must not be negative");
  }
  PrefetchTicket ticket;
  ticket.options = options;
  const auto now = Clock::now();
  switch (options.policy) {
    case PrefetchPolicy::kBestEffort: ticket.wait_until = now; break;
    case PrefetchPolicy::kWaitComplete: ticket.wait_until = now + options.deadline; break;
    case PrefetchPolicy::kTimeout:
      ticket.wait_until = now + std::min<Clock::duration>(
          options.deadline, options.timeout_base + options.timeout_per_1k_tokens *
                                                       static_cast<int64_t>(tokens.size()) / 1000);
      break;
  }
  auto conn = impl_->GetFor(ns);
  if (!conn.ok()) {
    ticket.fail_open = conn.status();
    return ticket;
  }
  v1::PrefetchRequest req;
  req.set_session_id((*conn)->session_id);
  req.set_epoch((*conn)->epoch);
  req.set_namespace_id(ns.id.ToBytes());
  req.set_deadline_ms(static_cast<uint64_t>(options.deadline.count()));
  LentTokens lent(req, tokens);
  v1::PrefetchResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + impl_->options().deadline);
  Status st = FromGrpcStatus((*conn)->stub->Prefetch(&ctx, req, &resp));
  impl_->Report(*conn, st, &ns.id);
  if (!st.ok()) {
    ticket.fail_open = st;
    return ticket;
  }
  ticket.id = resp.ticket();
  ticket.total_chunks = resp.total_chunks();
  ticket.nvme_chunks = resp.nvme_chunks();
  ticket.ready_chunks = resp.ready_chunks();
  ticket.session_id = (*conn)->session_id;
  return ticket;
}

PrefetchProgress Client::PrefetchStatus(const PrefetchTicket& ticket) {
  PrefetchProgress progress;
  if (ticket.id == 0) {
    progress.fail_open = ticket.fail_open.ok() ? Status::NotFound("no prefetch ticket")
                                               : ticket.fail_open;
    return progress;
  }
  auto conn = impl_->Get(impl_->options().deadline);
  if (!conn.ok() || (*conn)->session_id != ticket.session_id) {
    progress.fail_open = conn.ok() ? Status::NotFound("the ticket's session ended (reconnected)")
                                   : conn.status();
    return progress;
  }
  v1::PrefetchStatusRequest req;
  req.set_session_id(ticket.session_id);
  req.set_ticket(ticket.id);
  v1::PrefetchStatusResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + impl_->options().deadline);
  Status st = FromGrpcStatus((*conn)->stub->PrefetchStatus(&ctx, req, &resp));
  impl_->Report(*conn, st);
  if (!st.ok()) {
    progress.fail_open = st;
    return progress;
  }
  progress.ready_chunks = resp.ready_chunks();
  progress.total_chunks = resp.total_chunks();
  progress.done = resp.done();
  return progress;
}

// Before a Load with `ticket`: waits as its policy says (polling the daemon),
// and returns whether the ticket can be handed to the Lookup.
static bool WaitForPrefetch(Client& client, const PrefetchTicket& ticket, uint64_t session_id) {
  if (ticket.id == 0 || ticket.session_id != session_id) return false;
  while (Clock::now() < ticket.wait_until) {
    const PrefetchProgress p = client.PrefetchStatus(ticket);
    if (!p.fail_open.ok()) return p.fail_open.code() != StatusCode::kNotFound;
    if (p.done) break;
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
  return true;
}


// ---- ChunkLease -----------------------------------------------------------

struct ChunkLease::State {
  std::shared_ptr<Connection> conn;
  std::function<void(std::shared_ptr<Connection>, uint64_t)> release;
  uint64_t lease_id = 0;  // 0 once released
  uint64_t payload_bytes = 0;
  uint64_t header_bytes = 0;
  std::vector<uint64_t> offsets;    // payload offsets in the arena
  std::vector<uint64_t> sequences;  // slot sequence numbers at lookup
};

ChunkLease::ChunkLease() = default;
ChunkLease::~ChunkLease() { Release(); }
ChunkLease::ChunkLease(ChunkLease&&) noexcept = default;
ChunkLease& ChunkLease::operator=(ChunkLease&& other) noexcept {
  if (this != &other) {
    Release();
    state_ = std::move(other.state_);
    nvme_chunks = other.nvme_chunks;
    prefetched_chunks = other.prefetched_chunks;
    lookup_time = other.lookup_time;
    fail_open = std::move(other.fail_open);
  }
  return *this;
}

uint32_t ChunkLease::num_chunks() const {
  return state_ ? static_cast<uint32_t>(state_->offsets.size()) : 0;
}

std::span<const std::byte> ChunkLease::payload(size_t i) const {
  return {state_->conn->arena->base() + state_->offsets[i], state_->payload_bytes};
}

uint32_t ChunkLease::ValidChunks() const {
  uint32_t valid = 0;
  for (; valid < num_chunks(); ++valid) {
    const std::byte* slot =
        state_->conn->arena->base() + state_->offsets[valid] - state_->header_bytes;
    if (state_->sequences[valid] == 0 || SlotSequence(slot) != state_->sequences[valid]) break;
  }
  return valid;
}

std::shared_ptr<Arena> ChunkLease::mapping() const {
  return state_ ? state_->conn->arena : nullptr;
}

void ChunkLease::Release() {
  if (!state_ || state_->lease_id == 0) return;
  state_->release(state_->conn, state_->lease_id);
  state_->lease_id = 0;
}

Result<ChunkLease> Client::Acquire(const NamespaceHandle& ns, std::span<const int32_t> tokens,
                                   size_t max_chunks, const PrefetchTicket* ticket) {
  if (!impl_->Knows(ns.id)) return Status::InvalidArgument("namespace was not opened by this client");
  const uint64_t pb = ns.layout.payload_bytes;
  max_chunks = std::min<size_t>(max_chunks, tokens.size() / ns.spec.chunk_tokens);
  ChunkLease lease;
  if (max_chunks == 0) return lease;
  auto conn = impl_->GetFor(ns);
  if (!conn.ok()) {
    lease.fail_open = conn.status();
    return lease;
  }
  Connection& c = **conn;
  v1::LookupResponse resp;
  {
    const bool take_over = ticket != nullptr && WaitForPrefetch(*this, *ticket, c.session_id);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + impl_->options().deadline);
    v1::LookupRequest req = MakeLookup(c, ns, /*acquire=*/true);
    req.set_max_chunks(static_cast<uint32_t>(std::min<size_t>(max_chunks, UINT32_MAX)));
    if (take_over) req.set_prefetch_ticket(ticket->id);
    LentTokens lent(req, tokens);
    const auto start = Clock::now();
    Status st = FromGrpcStatus(c.stub->Lookup(&ctx, req, &resp));
    lease.lookup_time = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start);
    impl_->Report(*conn, st, &ns.id);
    if (!st.ok()) {
      lease.fail_open = st;
      return lease;
    }
  }
  lease.state_ = std::make_unique<ChunkLease::State>();
  ChunkLease::State& s = *lease.state_;
  s.conn = *conn;
  s.release = [impl = impl_.get()](std::shared_ptr<Connection> held, uint64_t id) {
    impl->ReleaseLater(std::move(held), id);
  };
  s.lease_id = resp.lease_id();
  s.payload_bytes = pb;
  s.header_bytes = ns.layout.header_bytes;
  // Every location is checked before any is used: a daemon that answers
  // nonsense is a fail-open, never a read outside the arena.
  Status bad;
  if (static_cast<uint32_t>(resp.chunks_size()) != resp.num_chunks() ||
      resp.num_chunks() > max_chunks) {
    bad = Status::DataLoss("daemon returned " + std::to_string(resp.chunks_size()) +
                           " chunk locations for " + std::to_string(resp.num_chunks()) +
                           " chunks");
  }
  for (int i = 0; bad.ok() && i < resp.chunks_size(); ++i) {
    const v1::ChunkLocation& loc = resp.chunks(i);
    if (loc.payload_bytes() != pb || loc.payload_offset() < ns.layout.header_bytes ||
        !c.arena->Contains(loc.payload_offset(), pb)) {
      bad = Status::DataLoss("daemon returned a chunk location outside the arena");
      break;
    }
    s.offsets.push_back(loc.payload_offset());
    s.sequences.push_back(loc.sequence());
  }
  if (!bad.ok()) {
    lease.Release();
    s.offsets.clear();
    s.sequences.clear();
    lease.fail_open = bad;
    return lease;
  }
  const uint32_t n = resp.num_chunks();
  lease.nvme_chunks = std::min(n, resp.nvme_chunks());
  lease.prefetched_chunks = std::min(n, resp.prefetched_chunks());
  return lease;
}

Result<LoadResult> Client::Load(const NamespaceHandle& ns, std::span<const int32_t> tokens,
                                const ChunkReader& reader, size_t max_chunks,
                                const PrefetchTicket* ticket) {
  auto acquired = Acquire(ns, tokens, max_chunks, ticket);
  if (!acquired.ok()) return acquired.status();
  ChunkLease& lease = *acquired;
  LoadResult result;
  result.lookup_time = lease.lookup_time;
  result.fail_open = lease.fail_open;
  const uint32_t n = lease.num_chunks();
  for (uint32_t i = 0; i < n; ++i) {
    Status st = reader(i, lease.payload(i));
    if (!st.ok()) return st;  // the reader's own error, not a fail-open (the lease ends)
  }
  // The copies are done: a chunk counts only if its slot still holds the
  // sequence it had at lookup. The first changed chunk ends the prefix.
  const uint32_t valid = lease.ValidChunks();
  lease.Release();
  if (valid < n) {
    result.fail_open = Status::Aborted("the lease on chunk " + std::to_string(valid) +
                                       " lapsed during the copy and its slot was reused");
  }
  result.num_chunks = valid;
  const uint32_t dram_chunks = n - lease.nvme_chunks;
  result.nvme_chunks = valid > dram_chunks ? valid - dram_chunks : 0;
  result.prefetched_chunks = std::min(valid, lease.prefetched_chunks);
  result.loaded_tokens = uint64_t{valid} * ns.spec.chunk_tokens;
  return result;
}

Result<LoadResult> Client::Load(const NamespaceHandle& ns, std::span<const int32_t> tokens,
                                std::span<std::byte> destination, const PrefetchTicket* ticket) {
  const uint64_t pb = ns.layout.payload_bytes;
  return Load(
      ns, tokens,
      [&](size_t i, std::span<const std::byte> payload) {
        std::memcpy(destination.data() + i * pb, payload.data(), pb);
        return Status::Ok();
      },
      destination.size() / pb, ticket);
}

// ---- ChunkReservation -----------------------------------------------------

struct ChunkReservation::State {
  std::shared_ptr<Connection> conn;
  std::function<void(const std::shared_ptr<Connection>&, const Status&)> report;
  std::chrono::milliseconds deadline{0};
  uint64_t reservation_id = 0;
  uint64_t payload_bytes = 0;
  std::vector<size_t> indices;     // chunk index in the prompt, per reserved chunk
  std::vector<uint64_t> offsets;   // payload offset in the arena, per reserved chunk
  bool finished = false;           // committed or aborted
};

ChunkReservation::ChunkReservation() = default;
ChunkReservation::~ChunkReservation() { Abort(); }
ChunkReservation::ChunkReservation(ChunkReservation&&) noexcept = default;
ChunkReservation& ChunkReservation::operator=(ChunkReservation&& other) noexcept {
  if (this != &other) {
    Abort();
    state_ = std::move(other.state_);
    already_stored_chunks = other.already_stored_chunks;
    dropped_chunks = other.dropped_chunks;
    fail_open = std::move(other.fail_open);
  }
  return *this;
}

size_t ChunkReservation::size() const { return state_ ? state_->indices.size() : 0; }
size_t ChunkReservation::chunk_index(size_t k) const { return state_->indices[k]; }
std::span<std::byte> ChunkReservation::payload(size_t k) const {
  return {state_->conn->arena->base() + state_->offsets[k], state_->payload_bytes};
}

std::shared_ptr<Arena> ChunkReservation::mapping() const {
  return state_ ? state_->conn->arena : nullptr;
}

void ChunkReservation::Abort() {
  if (!state_ || state_->finished) return;
  state_->finished = true;
  if (state_->reservation_id == 0) return;
  v1::AbortWriteRequest req;
  req.set_session_id(state_->conn->session_id);
  req.set_reservation_id(state_->reservation_id);
  v1::AbortWriteResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + state_->deadline);
  // A failed abort is not the caller's problem: the session or TTL frees it.
  state_->report(state_->conn, FromGrpcStatus(state_->conn->stub->AbortWrite(&ctx, req, &resp)));
}

Result<StoreResult> ChunkReservation::Commit() {
  StoreResult result;
  result.already_stored_chunks = already_stored_chunks;
  result.dropped_chunks = dropped_chunks;
  result.fail_open = fail_open;
  if (!state_ || state_->reservation_id == 0) return result;  // nothing was reserved
  if (state_->finished) {
    return Status::FailedPrecondition("the reservation was already committed or aborted");
  }
  state_->finished = true;
  v1::CommitWriteRequest req;
  req.set_session_id(state_->conn->session_id);
  req.set_reservation_id(state_->reservation_id);
  v1::CommitWriteResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + state_->deadline);
  Status st = FromGrpcStatus(state_->conn->stub->CommitWrite(&ctx, req, &resp));
  state_->report(state_->conn, st);
  if (!st.ok()) {
    result.fail_open = st;
    result.dropped_chunks += static_cast<uint32_t>(size());
    return result;
  }
  result.stored_chunks = resp.committed_chunks();
  result.dropped_chunks += resp.dropped_chunks();
  result.stored_bytes = uint64_t{result.stored_chunks} * state_->payload_bytes;
  return result;
}

Result<ChunkReservation> Client::Reserve(const NamespaceHandle& ns, std::span<const int32_t> tokens,
                                         size_t first_chunk) {
  if (!impl_->Knows(ns.id)) return Status::InvalidArgument("namespace was not opened by this client");
  const uint32_t ct = ns.spec.chunk_tokens;
  const std::vector<ChunkKey> keys = ChunkKeys(ns, tokens);
  ChunkReservation r;
  if (first_chunk >= keys.size()) return r;
  const auto all_dropped = static_cast<uint32_t>(keys.size() - first_chunk);
  auto conn = impl_->GetFor(ns);
  if (!conn.ok()) {
    r.fail_open = conn.status();
    r.dropped_chunks = all_dropped;
    return r;
  }
  Connection& c = **conn;
  v1::ReserveWriteRequest req;
  req.set_session_id(c.session_id);
  req.set_epoch(c.epoch);
  req.set_namespace_id(ns.id.ToBytes());
  for (size_t i = first_chunk; i < keys.size(); ++i) {
    auto* chunk = req.add_chunks();
    chunk->set_key(keys[i].ToBytes());
    chunk->set_parent_key((i == 0 ? ns.id : keys[i - 1]).ToBytes());
    chunk->set_tokens(PackTokens(tokens.subspan(i * ct, ct)));
  }
  v1::ReserveWriteResponse resp;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + impl_->options().deadline);
    Status st = FromGrpcStatus(c.stub->ReserveWrite(&ctx, req, &resp));
    impl_->Report(*conn, st, &ns.id);
    if (!st.ok()) {
      r.fail_open = st;
      r.dropped_chunks = all_dropped;
      return r;
    }
  }
  r.state_ = std::make_unique<ChunkReservation::State>();
  ChunkReservation::State& s = *r.state_;
  s.conn = *conn;
  s.report = [impl = impl_.get(), id = ns.id](const std::shared_ptr<Connection>& held,
                                              const Status& st) { impl->Report(held, st, &id); };
  s.deadline = impl_->options().deadline;
  s.reservation_id = resp.reservation_id();
  s.payload_bytes = ns.layout.payload_bytes;
  // Every location is checked before any is handed out.
  Status bad;
  if (resp.outcomes_size() != req.chunks_size()) {
    bad = Status::DataLoss("daemon returned " + std::to_string(resp.outcomes_size()) +
                           " outcomes for " + std::to_string(req.chunks_size()) + " chunks");
  }
  int loc_index = 0;
  for (int i = 0; bad.ok() && i < resp.outcomes_size(); ++i) {
    switch (resp.outcomes(i)) {
      case v1::ALREADY_STORED: ++r.already_stored_chunks; break;
      case v1::RESERVED: {
        if (loc_index >= resp.chunks_size()) {
          bad = Status::DataLoss("daemon returned too few chunk locations");
          break;
        }
        const v1::ChunkLocation& loc = resp.chunks(loc_index++);
        if (loc.payload_bytes() != s.payload_bytes ||
            !c.arena->Contains(loc.payload_offset(), s.payload_bytes)) {
          bad = Status::DataLoss("daemon returned a slot outside the arena");
          break;
        }
        s.indices.push_back(first_chunk + static_cast<size_t>(i));
        s.offsets.push_back(loc.payload_offset());
        break;
      }
      default: ++r.dropped_chunks; break;
    }
  }
  if (!bad.ok()) {  // the daemon's fault: fail open
    r.Abort();
    s.indices.clear();
    s.offsets.clear();
    r.fail_open = bad;
    r.already_stored_chunks = 0;
    r.dropped_chunks = all_dropped;
  }
  return r;
}

Result<StoreResult> Client::Store(const NamespaceHandle& ns, std::span<const int32_t> tokens,
                                  const ChunkWriter& writer, size_t first_chunk) {
  auto reserved = Reserve(ns, tokens, first_chunk);
  if (!reserved.ok()) return reserved.status();
  ChunkReservation& r = *reserved;
  for (size_t k = 0; k < r.size(); ++k) {
    Status st = writer(r.chunk_index(k), r.payload(k));
    if (!st.ok()) {
      r.Abort();
      return st;  // the writer's own error
    }
  }
  return r.Commit();
}

Result<StoreResult> Client::Store(const NamespaceHandle& ns, std::span<const int32_t> tokens,
                                  std::span<const std::byte> source, size_t first_chunk) {
  const uint64_t pb = ns.layout.payload_bytes;
  const uint64_t num_chunks = tokens.size() / ns.spec.chunk_tokens;
  if (source.size() < num_chunks * pb) {
    return Status::InvalidArgument("source holds " + std::to_string(source.size()) +
                                   " bytes, fewer than " + std::to_string(num_chunks) +
                                   " chunks of " + std::to_string(pb) + " bytes");
  }
  return Store(
      ns, tokens,
      [&](size_t i, std::span<std::byte> dst) {
        std::memcpy(dst.data(), source.data() + i * pb, pb);
        return Status::Ok();
      },
      first_chunk);
}

}  // namespace kvtier
