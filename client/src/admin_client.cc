#include "kvtier/admin_client.h"

#include <grpcpp/grpcpp.h>

#include "kvtier/proto/convert.h"
#include "kvtier/proto/status_mapping.h"
#include "kvtier/socket_path.h"
#include "kvtier/v1/kvtier.grpc.pb.h"

namespace kvtier {

class AdminClient::Impl {
 public:
  Impl(const std::string& socket_path, std::chrono::milliseconds deadline)
      : stub_(v1::Admin::NewStub(
            grpc::CreateChannel("unix:" + socket_path, grpc::InsecureChannelCredentials()))),
        deadline_(deadline) {}

  template <typename Req, typename Resp, typename Method>
  Status Call(Method method, Resp* resp, const Req& req = Req()) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + deadline_);
    return FromGrpcStatus((stub_.get()->*method)(&ctx, req, resp));
  }

 private:
  std::unique_ptr<v1::Admin::Stub> stub_;
  std::chrono::milliseconds deadline_;
};

AdminClient::AdminClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
AdminClient::~AdminClient() = default;

Result<std::unique_ptr<AdminClient>> AdminClient::Connect(const std::string& socket_path,
                                                          std::chrono::milliseconds deadline) {
  KVTIER_RETURN_IF_ERROR(CheckSocketPath(socket_path));
  if (deadline.count() <= 0) return Status::InvalidArgument("deadline must be positive");
  return std::unique_ptr<AdminClient>(
      new AdminClient(std::make_unique<Impl>(socket_path, deadline)));
}

Result<DaemonStats> AdminClient::Stats() {
  v1::StatsResponse r;
  KVTIER_RETURN_IF_ERROR((impl_->Call<v1::StatsRequest>(&v1::Admin::Stub::Stats, &r)));
  DaemonStats s;
  for (const auto& t : r.tiers()) {
    s.tiers.push_back({t.name(),
                       t.capacity_bytes(),
                       t.used_bytes(),
                       t.capacity_chunks(),
                       t.chunks(),
                       t.hits(),
                       t.misses(),
                       t.evictions(),
                       t.read_bytes(),
                       t.write_bytes(),
                       t.pending_writes(),
                       t.corrupt_reads(),
                       t.io_errors(),
                       t.degraded(),
                       t.skipped_writes(),
                       t.lost_writes(),
                       t.pinned_chunks(),
                       t.uncommitted_bytes(),
                       t.throttled_writes(),
                       t.unserved_hits(),
                       t.unserved_read_bytes()});
  }
  s.lookups = r.lookups();
  s.ring_lookups = r.ring_lookups();
  s.ring_calls = r.ring_calls();
  s.lookup_tokens = r.lookup_tokens();
  s.hit_tokens = r.hit_tokens();
  s.sessions = r.sessions();
  s.active_leases = r.active_leases();
  s.active_reservations = r.active_reservations();
  s.uptime_s = r.uptime_s();
  s.active_prefetches = r.active_prefetches();
  s.prefetched_chunks = r.prefetched_chunks();
  s.session_limited = r.session_limited();
  s.lookup_chunks = r.lookup_chunks();
  s.unserved_hit_tokens = r.unserved_hit_tokens();
  const auto tier_tokens = [](const v1::TierTokens& t) {
    return TierTokens{t.hbm(), t.dram(), t.nvme(), t.remote()};
  };
  for (const auto& m : r.models()) {
    s.models.push_back({m.model_id(), m.lookup_tokens(), tier_tokens(m.hit_tokens()),
                        tier_tokens(m.unserved_hit_tokens())});
  }
  const v1::PrefetchOutcomes& p = r.prefetches();
  s.prefetches = {p.nothing_cached(), p.over_budget(), p.used(),
                  p.used_early(),     p.expired(),     p.session_ended()};
  return s;
}

Result<DaemonHealth> AdminClient::Health() {
  v1::HealthResponse r;
  KVTIER_RETURN_IF_ERROR((impl_->Call<v1::HealthRequest>(&v1::Admin::Stub::Health, &r)));
  return DaemonHealth{r.serving(),
                      r.version(),
                      r.epoch(),
                      r.pid(),
                      {r.degraded_tiers().begin(), r.degraded_tiers().end()}};
}

Result<std::vector<NamespaceInfo>> AdminClient::Namespaces() {
  v1::NamespacesResponse r;
  KVTIER_RETURN_IF_ERROR((impl_->Call<v1::NamespacesRequest>(&v1::Admin::Stub::Namespaces, &r)));
  std::vector<NamespaceInfo> out;
  for (const auto& n : r.namespaces()) {
    auto id = ChunkKey::FromWire(n.namespace_id());
    if (!id) return Status::DataLoss("daemon returned a namespace_id that is not 16 bytes");
    out.push_back({*id, FromProto(n.spec()), n.chunks(), n.slot_bytes()});
  }
  return out;
}

Result<std::vector<TierEviction>> AdminClient::Evict(const EvictScope& scope) {
  // The wire cannot tell empty tokens from none (a whole namespace): refused here.
  if (scope.tokens && scope.tokens->empty()) {
    return Status::InvalidArgument(
        "tokens is empty: give at least one chunk of token ids, or none to evict the whole "
        "namespace");
  }
  if (scope.tokens && scope.all) {
    return Status::InvalidArgument("tokens name a prompt prefix of a namespace; all takes none");
  }
  v1::EvictRequest req;
  req.set_all(scope.all);
  if (scope.ns) req.set_namespace_id(scope.ns->ToBytes());
  if (scope.tokens) req.set_tokens(PackTokens(*scope.tokens));
  v1::EvictResponse r;
  KVTIER_RETURN_IF_ERROR((impl_->Call(&v1::Admin::Stub::Evict, &r, req)));
  std::vector<TierEviction> out;
  for (const auto& t : r.tiers()) out.push_back({t.tier(), t.removed(), t.kept()});
  return out;
}

Result<ChunkList> AdminClient::ListChunks(const NamespaceId& ns, const std::vector<int32_t>& tokens,
                                          uint32_t limit) {
  v1::ListChunksRequest req;
  req.set_namespace_id(ns.ToBytes());
  if (!tokens.empty()) req.set_tokens(PackTokens(tokens));
  req.set_limit(limit);
  v1::ListChunksResponse r;
  KVTIER_RETURN_IF_ERROR((impl_->Call(&v1::Admin::Stub::ListChunks, &r, req)));
  ChunkList out;
  out.left_out = r.left_out();
  for (const v1::ChunkInfo& c : r.chunks()) {
    auto key = ChunkKey::FromWire(c.key());
    if (!key)
      return Status::Internal("kvtierd answered a chunk key of " + std::to_string(c.key().size()) +
                              " bytes");
    ChunkInfo info;
    info.key = *key;
    info.tiers.assign(c.tiers().begin(), c.tiers().end());
    info.payload_bytes = c.payload_bytes();
    info.slot_bytes = c.slot_bytes();
    if (c.has_age()) info.age_s = c.age_s();
    info.hits = c.hits();
    info.pinned = c.pinned();
    out.chunks.push_back(std::move(info));
  }
  return out;
}

Result<std::vector<DaemonSetting>> AdminClient::Config() {
  v1::ConfigResponse r;
  KVTIER_RETURN_IF_ERROR((impl_->Call<v1::ConfigRequest>(&v1::Admin::Stub::Config, &r)));
  std::vector<DaemonSetting> out;
  for (const v1::ConfigEntry& e : r.entries()) out.push_back({e.key(), e.value(), e.source()});
  return out;
}

}  // namespace kvtier
