#include "kvtier/daemon/core_wire.h"

#include <memory>

#include "kvtier/proto/convert.h"

namespace kvtier::wire {
namespace {

void ToWire(const core::ChunkLocation& from, v1::ChunkLocation* to) {
  to->set_payload_offset(from.payload_offset);
  to->set_payload_bytes(from.payload_bytes);
  to->set_sequence(from.sequence);
  to->set_hbm_payload_offset(from.hbm_payload_offset);
  to->set_hbm_sequence(from.hbm_sequence);
}

core::LookupRequest FromWire(const v1::LookupRequest& r) {
  return {.session_id = r.session_id(),
          .epoch = r.epoch(),
          .namespace_id = r.namespace_id(),
          .tokens = r.tokens(),
          .acquire = r.acquire(),
          .max_chunks = r.max_chunks(),
          .prefetch_ticket = r.prefetch_ticket(),
          .hbm = r.hbm(),
          .request_id = r.request_id(),
          .first_chunk = r.first_chunk(),
          .adopt_ticket = r.adopt_ticket()};
}

// The two enums agree number for number.
static_assert(static_cast<int>(core::ReserveOutcome::kReserved) == v1::RESERVED);
static_assert(static_cast<int>(core::ReserveOutcome::kAlreadyStored) == v1::ALREADY_STORED);
static_assert(static_cast<int>(core::ReserveOutcome::kNoSpace) == v1::NO_SPACE);
static_assert(static_cast<int>(core::ReserveOutcome::kNoParent) == v1::NO_PARENT);
static_assert(static_cast<int>(core::ReserveOutcome::kKeyTaken) == v1::KEY_TAKEN);
static_assert(static_cast<int>(core::ReserveOutcome::kSessionLimit) == v1::SESSION_LIMIT);
static_assert(static_cast<int>(core::ReserveOutcome::kNvmeBehind) == v1::NVME_BEHIND);
static_assert(static_cast<int>(core::ReserveOutcome::kBeingWritten) == v1::BEING_WRITTEN);

}  // namespace

void ToWire(const core::LookupResponse& from, v1::LookupResponse* to) {
  to->set_num_chunks(from.num_chunks);
  to->set_cached_tokens(from.cached_tokens);
  to->set_lease_id(from.lease_id);
  to->set_lease_ttl_ms(from.lease_ttl_ms);
  to->set_nvme_chunks(from.nvme_chunks);
  to->set_prefetched_chunks(from.prefetched_chunks);
  to->set_hbm_chunks(from.hbm_chunks);
  to->set_remote_chunks(from.remote_chunks);
  to->mutable_chunks()->Reserve(static_cast<int>(from.chunks.size()));
  for (const core::ChunkLocation& c : from.chunks) ToWire(c, to->add_chunks());
}

Status Run(CacheCore& core, const v1::OpenNamespaceRequest& req, v1::OpenNamespaceResponse* resp) {
  core::OpenNamespaceRequest r;
  r.session_id = req.session_id();
  if (req.has_spec()) r.spec = FromProto(req.spec());
  core::OpenNamespaceResponse out;
  const Status st = core.OpenNamespace(r, &out);
  if (!st.ok()) return st;
  resp->set_namespace_id(out.namespace_id.ToBytes());
  resp->set_payload_bytes(out.payload_bytes);
  resp->set_header_bytes(out.header_bytes);
  resp->set_slot_bytes(out.slot_bytes);
  return st;
}

void Lookup(CacheCore& core, const v1::LookupRequest& req, v1::LookupResponse* resp,
            CacheCore::Done done) {
  auto out = std::make_shared<core::LookupResponse>();
  core.Lookup(FromWire(req), out.get(), [out, resp, done = std::move(done)](Status st) {
    if (st.ok()) ToWire(*out, resp);
    done(std::move(st));
  });
}

Status Run(CacheCore& core, const v1::LookupRequest& req, v1::LookupResponse* resp) {
  core::LookupResponse out;
  const Status st = core.Lookup(FromWire(req), &out);
  if (st.ok()) ToWire(out, resp);
  return st;
}

Status Run(CacheCore& core, const v1::PrefetchRequest& req, v1::PrefetchResponse* resp) {
  core::PrefetchResponse out;
  const Status st = core.Prefetch({.session_id = req.session_id(),
                                   .epoch = req.epoch(),
                                   .namespace_id = req.namespace_id(),
                                   .tokens = req.tokens(),
                                   .deadline_ms = req.deadline_ms(),
                                   .max_chunks = req.max_chunks(),
                                   .to_hbm = req.to_hbm(),
                                   .request_id = req.request_id()},
                                  &out);
  if (!st.ok()) return st;
  resp->set_ticket(out.ticket);
  resp->set_total_chunks(out.total_chunks);
  resp->set_nvme_chunks(out.nvme_chunks);
  resp->set_ready_chunks(out.ready_chunks);
  resp->set_deadline_ms(out.deadline_ms);
  resp->set_remote_chunks(out.remote_chunks);
  return st;
}

Status Run(CacheCore& core, const v1::PrefetchStatusRequest& req,
           v1::PrefetchStatusResponse* resp) {
  core::PrefetchStatusResponse out;
  const Status st = core.PrefetchStatus(req.session_id(), req.ticket(), &out);
  if (!st.ok()) return st;
  resp->set_ready_chunks(out.ready_chunks);
  resp->set_total_chunks(out.total_chunks);
  resp->set_done(out.done);
  resp->set_hbm_chunks(out.hbm_chunks);
  resp->set_hbm_done(out.hbm_done);
  return st;
}

Status Run(CacheCore& core, const v1::ReleaseReadRequest& req) {
  return core.ReleaseRead(req.session_id(), req.lease_id());
}

Status Run(CacheCore& core, const v1::ReserveWriteRequest& req, v1::ReserveWriteResponse* resp) {
  core::ReserveWriteRequest r;
  r.session_id = req.session_id();
  r.epoch = req.epoch();
  r.namespace_id = req.namespace_id();
  r.chunks.reserve(static_cast<size_t>(req.chunks_size()));
  for (const v1::ChunkToWrite& c : req.chunks()) {
    r.chunks.push_back({.key = c.key(), .parent_key = c.parent_key(), .tokens = c.tokens()});
  }
  core::ReserveWriteResponse out;
  const Status st = core.ReserveWrite(r, &out);
  if (!st.ok()) return st;
  resp->set_reservation_id(out.reservation_id);
  resp->set_reservation_ttl_ms(out.reservation_ttl_ms);
  for (core::ReserveOutcome o : out.outcomes) {
    resp->add_outcomes(static_cast<v1::ReserveOutcome>(static_cast<int>(o)));
  }
  for (const core::ChunkLocation& c : out.chunks) ToWire(c, resp->add_chunks());
  return st;
}

Status Run(CacheCore& core, const v1::CommitWriteRequest& req, v1::CommitWriteResponse* resp) {
  core::CommitWriteResponse out;
  const Status st = core.CommitWrite(req.session_id(), req.reservation_id(), &out);
  if (!st.ok()) return st;
  resp->set_committed_chunks(out.committed_chunks);
  resp->set_dropped_chunks(out.dropped_chunks);
  return st;
}

Status Run(CacheCore& core, const v1::AbortWriteRequest& req) {
  return core.AbortWrite(req.session_id(), req.reservation_id());
}

Status Run(CacheCore& core, const v1::EvictRequest& req, v1::EvictResponse* resp) {
  core::EvictResponse out;
  const Status st = core.Evict(
      {.all = req.all(), .namespace_id = req.namespace_id(), .tokens = req.tokens()}, &out);
  for (const core::TierEviction& t : out.tiers) {  // what was done, also on an error
    v1::TierEviction* w = resp->add_tiers();
    w->set_tier(t.tier);
    w->set_removed(t.removed);
    w->set_kept(t.kept);
  }
  return st;
}

Status Run(CacheCore& core, const v1::ListChunksRequest& req, v1::ListChunksResponse* resp) {
  core::ListChunksResponse out;
  KVTIER_RETURN_IF_ERROR(core.ListChunks(
      {.namespace_id = req.namespace_id(), .tokens = req.tokens(), .limit = req.limit()}, &out));
  for (const core::ChunkListing& c : out.chunks) {
    v1::ChunkInfo* w = resp->add_chunks();
    w->set_key(c.key.ToBytes());
    if (c.in_hbm) w->add_tiers("hbm");
    if (c.in_dram) w->add_tiers("dram");
    if (c.in_nvme) w->add_tiers("nvme");
    w->set_payload_bytes(c.payload_bytes);
    w->set_slot_bytes(c.slot_bytes);
    w->set_has_age(c.age_s.has_value());
    w->set_age_s(c.age_s.value_or(0));
    w->set_hits(c.hits);
    w->set_pinned(c.pinned);
  }
  resp->set_left_out(out.left_out);
  return Status::Ok();
}

void Run(CacheCore& core, v1::StatsResponse* resp) {
  const core::StatsResponse s = core.Stats();
  for (const core::TierStats& t : s.tiers) {
    v1::TierStats* w = resp->add_tiers();
    w->set_name(t.name);
    w->set_capacity_bytes(t.capacity_bytes);
    w->set_used_bytes(t.used_bytes);
    w->set_capacity_chunks(t.capacity_chunks);
    w->set_chunks(t.chunks);
    w->set_hits(t.hits);
    w->set_misses(t.misses);
    w->set_evictions(t.evictions);
    w->set_read_bytes(t.read_bytes);
    w->set_write_bytes(t.write_bytes);
    w->set_pending_writes(t.pending_writes);
    w->set_corrupt_reads(t.corrupt_reads);
    w->set_io_errors(t.io_errors);
    w->set_degraded(t.degraded);
    w->set_skipped_writes(t.skipped_writes);
    w->set_lost_writes(t.lost_writes);
    w->set_pinned_chunks(t.pinned_chunks);
    w->set_uncommitted_bytes(t.uncommitted_bytes);
    w->set_throttled_writes(t.throttled_writes);
    w->set_unserved_hits(t.unserved_hits);
    w->set_unserved_read_bytes(t.unserved_read_bytes);
  }
  resp->set_lookups(s.lookups);
  resp->set_lookup_tokens(s.lookup_tokens);
  resp->set_hit_tokens(s.hit_tokens);
  resp->set_sessions(s.sessions);
  resp->set_active_leases(s.active_leases);
  resp->set_active_reservations(s.active_reservations);
  resp->set_uptime_s(s.uptime_s);
  resp->set_active_prefetches(s.active_prefetches);
  resp->set_prefetched_chunks(s.prefetched_chunks);
  resp->set_session_limited(s.session_limited);
  resp->set_ring_lookups(s.ring_lookups);
  resp->set_ring_calls(s.ring_calls);
  resp->set_lookup_chunks(s.lookup_chunks);
  resp->set_unserved_hit_tokens(s.unserved_hit_tokens);
  const auto tier_tokens = [](const core::TierTokens& t, v1::TierTokens* w) {
    w->set_hbm(t.hbm);
    w->set_dram(t.dram);
    w->set_nvme(t.nvme);
    w->set_remote(t.remote);
  };
  for (const core::ModelStats& m : s.models) {
    v1::ModelStats* w = resp->add_models();
    w->set_model_id(m.model_id);
    w->set_lookup_tokens(m.lookup_tokens);
    tier_tokens(m.hit_tokens, w->mutable_hit_tokens());
    tier_tokens(m.unserved_hit_tokens, w->mutable_unserved_hit_tokens());
  }
  v1::PrefetchOutcomes* p = resp->mutable_prefetches();
  p->set_nothing_cached(s.prefetches.nothing_cached);
  p->set_over_budget(s.prefetches.over_budget);
  p->set_used(s.prefetches.used);
  p->set_used_early(s.prefetches.used_early);
  p->set_expired(s.prefetches.expired);
  p->set_session_ended(s.prefetches.session_ended);
}

void Run(CacheCore& core, v1::NamespacesResponse* resp) {
  for (const core::NamespaceInfo& ns : core.Namespaces()) {
    v1::NamespaceInfo* w = resp->add_namespaces();
    w->set_namespace_id(ns.namespace_id.ToBytes());
    *w->mutable_spec() = ToProto(ns.spec);
    w->set_chunks(ns.chunks);
    w->set_slot_bytes(ns.slot_bytes);
  }
}

}  // namespace kvtier::wire
