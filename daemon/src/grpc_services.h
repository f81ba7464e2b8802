// The gRPC adapters over CacheCore: validate nothing themselves, block on
// nothing, and map Status once (kvtier/proto/status_mapping.h).
//
// Thread-safety: thread-safe (CacheCore is).
#pragma once

#include <string>
#include <vector>

#include "kvtier/daemon/cache_core.h"
#include "kvtier/daemon/daemon_options.h"
#include "kvtier/v1/kvtier.grpc.pb.h"
#include "peer_listener.h"

namespace kvtier {

class KvCacheService final : public v1::KvCache::CallbackService {
 public:
  explicit KvCacheService(CacheCore& core) : core_(core) {}

  grpc::ServerBidiReactor<v1::SessionHello, v1::SessionOpened>* Session(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* OpenNamespace(grpc::CallbackServerContext* ctx,
                                          const v1::OpenNamespaceRequest* req,
                                          v1::OpenNamespaceResponse* resp) override;
  grpc::ServerUnaryReactor* Lookup(grpc::CallbackServerContext* ctx, const v1::LookupRequest* req,
                                   v1::LookupResponse* resp) override;
  grpc::ServerUnaryReactor* ReserveWrite(grpc::CallbackServerContext* ctx,
                                         const v1::ReserveWriteRequest* req,
                                         v1::ReserveWriteResponse* resp) override;
  grpc::ServerUnaryReactor* CommitWrite(grpc::CallbackServerContext* ctx,
                                        const v1::CommitWriteRequest* req,
                                        v1::CommitWriteResponse* resp) override;
  grpc::ServerUnaryReactor* AbortWrite(grpc::CallbackServerContext* ctx,
                                       const v1::AbortWriteRequest* req,
                                       v1::AbortWriteResponse* resp) override;
  grpc::ServerUnaryReactor* ReleaseRead(grpc::CallbackServerContext* ctx,
                                        const v1::ReleaseReadRequest* req,
                                        v1::ReleaseReadResponse* resp) override;
  grpc::ServerUnaryReactor* Prefetch(grpc::CallbackServerContext* ctx,
                                     const v1::PrefetchRequest* req,
                                     v1::PrefetchResponse* resp) override;
  grpc::ServerUnaryReactor* PrefetchStatus(grpc::CallbackServerContext* ctx,
                                           const v1::PrefetchStatusRequest* req,
                                           v1::PrefetchStatusResponse* resp) override;

 private:
  // The call's kvtier-session-token metadata against `session_id`'s token.
  Status Authorize(grpc::CallbackServerContext* ctx, uint64_t session_id) const;

  CacheCore& core_;
};

class AdminService final : public v1::Admin::CallbackService {
 public:
  // `config`: what Config answers (EffectiveConfig). `peers` (may be null; must
  // outlive this) names who called, in the audit lines.
  AdminService(CacheCore& core, std::vector<ConfigSetting> config, const PeerBook* peers)
      : core_(core), config_(std::move(config)), peers_(peers) {}

  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* ctx, const v1::StatsRequest* req,
                                  v1::StatsResponse* resp) override;
  grpc::ServerUnaryReactor* Health(grpc::CallbackServerContext* ctx, const v1::HealthRequest* req,
                                   v1::HealthResponse* resp) override;
  grpc::ServerUnaryReactor* Namespaces(grpc::CallbackServerContext* ctx,
                                       const v1::NamespacesRequest* req,
                                       v1::NamespacesResponse* resp) override;
  // Leaves an audit line (who, what, what it did) in the daemon's log.
  grpc::ServerUnaryReactor* Evict(grpc::CallbackServerContext* ctx, const v1::EvictRequest* req,
                                  v1::EvictResponse* resp) override;
  grpc::ServerUnaryReactor* ListChunks(grpc::CallbackServerContext* ctx,
                                       const v1::ListChunksRequest* req,
                                       v1::ListChunksResponse* resp) override;
  grpc::ServerUnaryReactor* Config(grpc::CallbackServerContext* ctx, const v1::ConfigRequest* req,
                                   v1::ConfigResponse* resp) override;

 private:
  // Who made the call, for an audit line: "peer fd:7 (pid P uid U gid G)".
  std::string Caller(grpc::CallbackServerContext* ctx) const;

  CacheCore& core_;
  const std::vector<ConfigSetting> config_;
  const PeerBook* peers_;
};

}  // namespace kvtier
