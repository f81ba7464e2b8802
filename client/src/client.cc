#include "kvtier/client.h"

#include "client_impl.h"

namespace kvtier {

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
  if (options.client_name.size() > 256) {  // kvtierd ends a session with a longer one
    return Status::InvalidArgument("client_name is " + std::to_string(options.client_name.size()) +
                                   " bytes, more than 256");
  }
  KVTIER_RETURN_IF_ERROR(
      CheckSocketPath(options.socket_path.empty() ? DefaultSocketPath() : options.socket_path));
  std::unique_ptr<Client> client(new Client(std::make_unique<Impl>(options)));
  auto conn = client->impl_->Get(Clock::now() + options.connect_timeout);
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
  const auto deadline = impl_->CallDeadline();
  auto conn = impl_->Get(deadline);
  if (conn.ok()) {
    Status st = impl_->EnsureRegistered(*conn, spec, ns.id, deadline);
    // The daemon's refusals of this namespace itself are the caller's to see:
    // a slot larger than the arena, or the daemon's namespace limit.
    if (st.code() == StatusCode::kInvalidArgument || st.code() == StatusCode::kResourceExhausted) {
      return st;
    }
  }
  impl_->AddNamespace(ns);
  return ns;
}

std::vector<ChunkKey> Client::ChunkKeys(const NamespaceHandle& ns,
                                        std::span<const int32_t> tokens) {
  return ns.spec.ChunkKeys(ns.id, tokens);
}

Result<LookupResult> Client::Lookup(const NamespaceHandle& ns, std::span<const int32_t> tokens,
                                    std::string_view request_id) {
  if (!impl_->Knows(ns.id))
    return Status::InvalidArgument("namespace was not opened by this client");
  KVTIER_RETURN_IF_ERROR(CheckRequestId(request_id));
  LookupResult result;
  const auto deadline = impl_->CallDeadline();
  auto conn = impl_->GetFor(ns, deadline);
  if (!conn.ok()) {
    result.fail_open = conn.status();
    return result;
  }
  v1::LookupResponse resp;
  v1::LookupRequest req = MakeLookup(**conn, ns, /*acquire=*/false);
  req.set_request_id(std::string(request_id));
  Status st = CallLookup(**conn, ns, deadline, req, tokens, &resp);
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
                                        const PrefetchOptions& options,
                                        std::string_view request_id) {
  if (!impl_->Knows(ns.id))
    return Status::InvalidArgument("namespace was not opened by this client");
  KVTIER_RETURN_IF_ERROR(CheckRequestId(request_id));
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
    case PrefetchPolicy::kBestEffort:
      ticket.wait_until = now;
      break;
    case PrefetchPolicy::kWaitComplete:
      ticket.wait_until = now + options.deadline;
      break;
    case PrefetchPolicy::kTimeout:
      ticket.wait_until =
          now + std::min<Clock::duration>(
                    options.deadline,
                    options.timeout_base +
                        options.timeout_per_1k_tokens * static_cast<int64_t>(tokens.size()) / 1000);
      break;
  }
  const auto deadline = impl_->CallDeadline();
  auto conn = impl_->GetFor(ns, deadline);
  if (!conn.ok()) {
    ticket.fail_open = conn.status();
    return ticket;
  }
  if (options.to_hbm &&
      !(*conn)->hbm) {  // asked here: the daemon's refusal would look like a lost session
    ticket.fail_open = Status::FailedPrecondition("to_hbm: kvtierd runs without an HBM tier");
    return ticket;
  }
  v1::PrefetchRequest req;
  req.set_session_id((*conn)->session_id);
  req.set_epoch((*conn)->epoch);
  req.set_namespace_id(ns.id.ToBytes());
  req.set_deadline_ms(static_cast<uint64_t>(options.deadline.count()));
  req.set_to_hbm(options.to_hbm);
  req.set_request_id(std::string(request_id));
  LentTokens lent(req, tokens);
  v1::PrefetchResponse resp;
  CallContext ctx(**conn, deadline);
  Status st = FromGrpcStatus((*conn)->stub->Prefetch(ctx.get(), req, &resp));
  impl_->Report(*conn, st, &ns.id);
  if (!st.ok()) {
    ticket.fail_open = st;
    return ticket;
  }
  ticket.id = resp.ticket();
  ticket.total_chunks = resp.total_chunks();
  ticket.nvme_chunks = resp.nvme_chunks();
  ticket.remote_chunks = resp.remote_chunks();
  ticket.ready_chunks = resp.ready_chunks();
  ticket.session_id = (*conn)->session_id;
  return ticket;
}

PrefetchProgress Client::PrefetchStatus(const PrefetchTicket& ticket) {
  PrefetchProgress progress;
  if (ticket.id == 0) {
    progress.fail_open =
        ticket.fail_open.ok() ? Status::NotFound("no prefetch ticket") : ticket.fail_open;
    return progress;
  }
  const auto deadline = impl_->CallDeadline();
  auto conn = impl_->Get(deadline);
  if (!conn.ok() || (*conn)->session_id != ticket.session_id) {
    progress.fail_open =
        conn.ok() ? Status::NotFound("the ticket's session ended (reconnected)") : conn.status();
    return progress;
  }
  v1::PrefetchStatusRequest req;
  req.set_session_id(ticket.session_id);
  req.set_ticket(ticket.id);
  v1::PrefetchStatusResponse resp;
  Connection& c = **conn;
  Status st = CallUnary(
      c, RingOp::kPrefetchStatus, deadline, req, &resp,
      [&c](auto* ctx, const auto& r, auto* o) { return c.stub->PrefetchStatus(ctx, r, o); });
  impl_->Report(*conn, st);
  if (!st.ok()) {
    progress.fail_open = st;
    return progress;
  }
  progress.ready_chunks = resp.ready_chunks();
  progress.total_chunks = resp.total_chunks();
  progress.hbm_chunks = resp.hbm_chunks();
  progress.hbm_done = resp.hbm_done();
  progress.done = resp.done();
  return progress;
}

std::optional<HbmPoolInfo> Client::HbmPool() {
  auto conn = impl_->Get(impl_->CallDeadline());
  if (!conn.ok()) return std::nullopt;
  return (*conn)->hbm;
}

namespace client_internal {

bool WaitForPrefetch(Client& client, const PrefetchTicket& ticket, uint64_t session_id) {
  if (ticket.id == 0 || ticket.session_id != session_id) return false;
  while (Clock::now() < ticket.wait_until) {
    const PrefetchProgress p = client.PrefetchStatus(ticket);
    if (!p.fail_open.ok()) return p.fail_open.code() != StatusCode::kNotFound;
    if (p.done && (!ticket.options.to_hbm || p.hbm_done)) break;  // to_hbm: its HBM copies too
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
  return true;
}

}  // namespace client_internal
}  // namespace kvtier
