#include "grpc_services.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include "kvtier/daemon/core_wire.h"
#include "kvtier/proto/status_mapping.h"
#include "kvtier/proto/transport_args.h"

namespace kvtier {
namespace {

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* ctx, const Status& st) {
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(st));
  return reactor;
}

// One per Session stream: reads the hello, answers SessionOpened, then keeps a
// read pending so that the stream's end (client exit, crash, cancel) is seen at
// once; OnDone ends the session in the core.
class SessionReactor final : public grpc::ServerBidiReactor<v1::SessionHello, v1::SessionOpened> {
 public:
  explicit SessionReactor(CacheCore& core) : core_(core) { StartRead(&hello_); }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    if (session_id_ != 0 && hello_.closing()) {  // the client's writers stopped: it says so
      writers_stopped_ = true;
      StartWrite(&opened_);  // the acknowledgement it waits for
    }
    if (session_id_ == 0) {
      if (hello_.client_name().size() > CacheCore::kMaxClientNameBytes) {
        Finish(ToGrpcStatus(Status::InvalidArgument(
            "client_name is " + std::to_string(hello_.client_name().size()) + " bytes, more than " +
            std::to_string(CacheCore::kMaxClientNameBytes))));
        return;
      }
      session_id_ = core_.OpenSession(hello_.client_name(), hello_.pid());
      opened_.set_session_id(session_id_);
      opened_.set_session_token(core_.SessionToken(session_id_));
      opened_.set_epoch(core_.epoch());
      opened_.set_arena_bytes(core_.arena().bytes());
      opened_.set_lease_ttl_ms(static_cast<uint64_t>(core_.options().lease_ttl.count()));
      if (const HbmTier* hbm = core_.hbm()) {
        v1::HbmPool* pool = opened_.mutable_hbm();
        pool->set_ipc_handle(hbm->ipc_handle());
        pool->set_pool_bytes(hbm->capacity_bytes());
        pool->set_backend(hbm->backend_name());
        pool->set_device(hbm->device());
      }
      spdlog::debug("session {} opened by {} (pid {})", session_id_, hello_.client_name(),
                    hello_.pid());
      StartWrite(&opened_);
    }
    StartRead(&hello_);
  }
  void OnWriteDone(bool /*ok*/) override {}
  void OnDone() override {
    if (session_id_ != 0) core_.EndSession(session_id_, writers_stopped_);
    delete this;
  }

 private:
  CacheCore& core_;
  v1::SessionHello hello_;
  v1::SessionOpened opened_;
  uint64_t session_id_ = 0;
  bool writers_stopped_ = false;  // a closing hello came
};

}  // namespace

grpc::ServerBidiReactor<v1::SessionHello, v1::SessionOpened>* KvCacheService::Session(
    grpc::CallbackServerContext* /*ctx*/) {
  return new SessionReactor(core_);
}

Status KvCacheService::Authorize(grpc::CallbackServerContext* ctx, uint64_t session_id) const {
  const auto& md = ctx->client_metadata();
  auto it = md.find(kSessionTokenKey);
  const std::string_view token =
      it == md.end() ? std::string_view() : std::string_view(it->second.data(), it->second.size());
  return core_.CheckSessionToken(session_id, token);
}

grpc::ServerUnaryReactor* KvCacheService::OpenNamespace(grpc::CallbackServerContext* ctx,
                                                        const v1::OpenNamespaceRequest* req,
                                                        v1::OpenNamespaceResponse* resp) {
  if (Status st = Authorize(ctx, req->session_id()); !st.ok()) return Done(ctx, st);
  return Done(ctx, wire::Run(core_, *req, resp));
}

// A client that gave up (deadline passed, call cancelled) never learns of a
// lease or reservation granted to it: end it now instead of at its TTL.
// A Lookup that promotes from NVMe finishes later, on the core's I/O worker.
grpc::ServerUnaryReactor* KvCacheService::Lookup(grpc::CallbackServerContext* ctx,
                                                 const v1::LookupRequest* req,
                                                 v1::LookupResponse* resp) {
  if (Status st = Authorize(ctx, req->session_id()); !st.ok()) return Done(ctx, st);
  auto* reactor = ctx->DefaultReactor();
  wire::Lookup(core_, *req, resp, [this, ctx, reactor, req, resp](Status st) {
    if (st.ok() && resp->lease_id() != 0 && ctx->IsCancelled()) {
      (void)core_.ReleaseUnserved(req->session_id(), resp->lease_id());
    }
    reactor->Finish(ToGrpcStatus(st));
  });
  return reactor;
}

grpc::ServerUnaryReactor* KvCacheService::Prefetch(grpc::CallbackServerContext* ctx,
                                                   const v1::PrefetchRequest* req,
                                                   v1::PrefetchResponse* resp) {
  if (Status st = Authorize(ctx, req->session_id()); !st.ok()) return Done(ctx, st);
  return Done(ctx, wire::Run(core_, *req, resp));
}

grpc::ServerUnaryReactor* KvCacheService::PrefetchStatus(grpc::CallbackServerContext* ctx,
                                                         const v1::PrefetchStatusRequest* req,
                                                         v1::PrefetchStatusResponse* resp) {
  if (Status st = Authorize(ctx, req->session_id()); !st.ok()) return Done(ctx, st);
  return Done(ctx, wire::Run(core_, *req, resp));
}

grpc::ServerUnaryReactor* KvCacheService::ReserveWrite(grpc::CallbackServerContext* ctx,
                                                       const v1::ReserveWriteRequest* req,
                                                       v1::ReserveWriteResponse* resp) {
  if (Status st = Authorize(ctx, req->session_id()); !st.ok()) return Done(ctx, st);
  Status st = wire::Run(core_, *req, resp);
  if (st.ok() && resp->reservation_id() != 0 && ctx->IsCancelled()) {
    (void)core_.AbortWrite(req->session_id(), resp->reservation_id());
  }
  return Done(ctx, st);
}

grpc::ServerUnaryReactor* KvCacheService::CommitWrite(grpc::CallbackServerContext* ctx,
                                                      const v1::CommitWriteRequest* req,
                                                      v1::CommitWriteResponse* resp) {
  if (Status st = Authorize(ctx, req->session_id()); !st.ok()) return Done(ctx, st);
  return Done(ctx, wire::Run(core_, *req, resp));
}

grpc::ServerUnaryReactor* KvCacheService::AbortWrite(grpc::CallbackServerContext* ctx,
                                                     const v1::AbortWriteRequest* req,
                                                     v1::AbortWriteResponse* /*resp*/) {
  if (Status st = Authorize(ctx, req->session_id()); !st.ok()) return Done(ctx, st);
  return Done(ctx, wire::Run(core_, *req));
}

grpc::ServerUnaryReactor* KvCacheService::ReleaseRead(grpc::CallbackServerContext* ctx,
                                                      const v1::ReleaseReadRequest* req,
                                                      v1::ReleaseReadResponse* /*resp*/) {
  if (Status st = Authorize(ctx, req->session_id()); !st.ok()) return Done(ctx, st);
  return Done(ctx, wire::Run(core_, *req));
}

grpc::ServerUnaryReactor* AdminService::Stats(grpc::CallbackServerContext* ctx,
                                              const v1::StatsRequest* /*req*/,
                                              v1::StatsResponse* resp) {
  wire::Run(core_, resp);
  return Done(ctx, Status::Ok());
}

grpc::ServerUnaryReactor* AdminService::Health(grpc::CallbackServerContext* ctx,
                                               const v1::HealthRequest* /*req*/,
                                               v1::HealthResponse* resp) {
  resp->set_serving(true);
  resp->set_version(KVTIER_VERSION);
  resp->set_epoch(core_.epoch());
  resp->set_pid(static_cast<uint32_t>(getpid()));
  for (const std::string& t : core_.DegradedTiers()) resp->add_degraded_tiers(t);
  return Done(ctx, Status::Ok());
}

grpc::ServerUnaryReactor* AdminService::Namespaces(grpc::CallbackServerContext* ctx,
                                                   const v1::NamespacesRequest* /*req*/,
                                                   v1::NamespacesResponse* resp) {
  wire::Run(core_, resp);
  return Done(ctx, Status::Ok());
}

grpc::ServerUnaryReactor* AdminService::Evict(grpc::CallbackServerContext* ctx,
                                              const v1::EvictRequest* req,
                                              v1::EvictResponse* resp) {
  std::string scope = "everything";
  if (!req->all()) {
    auto id = ChunkKey::FromWire(req->namespace_id());
    scope = "namespace " + (id ? id->ToHex() : "(malformed)");
    if (!req->tokens().empty()) {
      scope += " prefix of " + std::to_string(req->tokens().size() / 4) + " tokens";
    }
  }
  const Status st = wire::Run(core_, *req, resp);
  std::string outcome;
  for (const v1::TierEviction& t : resp->tiers()) {
    outcome += fmt::format("{}{}: {} removed, {} kept under lease", outcome.empty() ? "" : "; ",
                           t.tier(), t.removed(), t.kept());
  }
  if (st.ok()) {
    spdlog::info("admin: evict {} ({}): {}", scope, Caller(ctx), outcome);
  } else {
    spdlog::warn("admin: evict {} ({}) refused: {}", scope, Caller(ctx), st.ToString());
  }
  return Done(ctx, st);
}

std::string AdminService::Caller(grpc::CallbackServerContext* ctx) const {
  const std::string peer = ctx->peer();
  const std::string who = peers_ ? peers_->Describe(peer) : "";
  return "peer " + peer + (who.empty() ? "" : " (" + who + ")");
}

grpc::ServerUnaryReactor* AdminService::ListChunks(grpc::CallbackServerContext* ctx,
                                                   const v1::ListChunksRequest* req,
                                                   v1::ListChunksResponse* resp) {
  return Done(ctx, wire::Run(core_, *req, resp));
}

grpc::ServerUnaryReactor* AdminService::Config(grpc::CallbackServerContext* ctx,
                                               const v1::ConfigRequest* /*req*/,
                                               v1::ConfigResponse* resp) {
  for (const ConfigSetting& c : config_) {
    v1::ConfigEntry* e = resp->add_entries();
    e->set_key(c.key);
    e->set_value(c.value);
    e->set_source(c.source);
  }
  return Done(ctx, Status::Ok());
}

}  // namespace kvtier
