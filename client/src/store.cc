// ChunkReservation, and Client::Reserve and Client::Store built on it.
#include <cstring>

#include "client_impl.h"

namespace kvtier {

// ---- ChunkReservation -----------------------------------------------------

struct ChunkReservation::State {
  std::shared_ptr<Connection> conn;
  std::function<void(const std::shared_ptr<Connection>&, const Status&)> report;
  // Aborts the reservation off the caller's path (Client::Impl::AbortLater).
  std::function<void(const std::shared_ptr<Connection>&, uint64_t)> abort_later;
  std::chrono::milliseconds deadline{0};
  uint64_t reservation_id = 0;
  uint64_t payload_bytes = 0;
  std::vector<size_t> indices;    // chunk index in the prompt, per reserved chunk
  std::vector<uint64_t> offsets;  // payload offset in the arena, per reserved chunk
  bool finished = false;          // committed or aborted
};

ChunkReservation::ChunkReservation() = default;
ChunkReservation::~ChunkReservation() { Abort(); }
ChunkReservation::ChunkReservation(ChunkReservation&&) noexcept = default;
ChunkReservation& ChunkReservation::operator=(ChunkReservation&& other) noexcept {
  if (this != &other) {
    Abort();
    state_ = std::move(other.state_);
    already_stored_chunks = other.already_stored_chunks;
    being_written_chunks = other.being_written_chunks;
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

bool ChunkReservation::writable() const {
  return state_ && state_->reservation_id != 0 && !state_->finished;
}

void ChunkReservation::Abort() {
  if (!state_ || state_->finished) return;
  state_->finished = true;
  if (state_->reservation_id == 0) return;
  v1::AbortWriteRequest req;
  req.set_session_id(state_->conn->session_id);
  req.set_reservation_id(state_->reservation_id);
  v1::AbortWriteResponse resp;
  Connection& c = *state_->conn;
  // A failed abort is not the caller's problem: the session or TTL frees it.
  state_->report(state_->conn, CallUnary(c, RingOp::kAbortWrite, Clock::now() + state_->deadline,
                                         req, &resp, [&c](auto* ctx, const auto& r, auto* o) {
                                           return c.stub->AbortWrite(ctx, r, o);
                                         }));
}

Result<StoreResult> ChunkReservation::Commit() {
  StoreResult result;
  result.already_stored_chunks = already_stored_chunks;
  result.being_written_chunks = being_written_chunks;
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
  Connection& c = *state_->conn;
  Status st =
      CallUnary(c, RingOp::kCommitWrite, Clock::now() + state_->deadline, req, &resp,
                [&c](auto* ctx, const auto& r, auto* o) { return c.stub->CommitWrite(ctx, r, o); });
  state_->report(state_->conn, st);
  if (!st.ok()) {
    // Unanswered, the commit may never run; the reservation would then hold
    // its keys (no one could store them) until its TTL.
    state_->abort_later(state_->conn, state_->reservation_id);
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
  if (!impl_->Knows(ns.id))
    return Status::InvalidArgument("namespace was not opened by this client");
  const uint32_t ct = ns.spec.chunk_tokens;
  const std::vector<ChunkKey> keys = ChunkKeys(ns, tokens);
  ChunkReservation r;
  if (first_chunk >= keys.size()) return r;
  const auto all_dropped = static_cast<uint32_t>(keys.size() - first_chunk);
  const auto deadline = impl_->CallDeadline();
  auto conn = impl_->GetFor(ns, deadline);
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
    chunk->set_parent_key(ns.spec.ChunkParent(ns.id, keys, i).ToBytes());
    chunk->set_tokens(PackTokens(tokens.subspan(i * ct, ct)));
  }
  v1::ReserveWriteResponse resp;
  {
    Status st = CallUnary(
        c, RingOp::kReserveWrite, deadline, req, &resp,
        [&c](auto* ctx, const auto& r, auto* o) { return c.stub->ReserveWrite(ctx, r, o); });
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
  const std::chrono::milliseconds ttl(resp.reservation_ttl_ms());
  s.abort_later = [impl = impl_.get(), ttl = ttl.count() > 0 ? ttl : s.deadline](
                      const std::shared_ptr<Connection>& held, uint64_t id) {
    impl->AbortLater(held, id, ttl);
  };
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
      case v1::ALREADY_STORED:
        ++r.already_stored_chunks;
        break;
      case v1::BEING_WRITTEN:
        ++r.being_written_chunks;
        break;
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
      default:
        ++r.dropped_chunks;
        break;
    }
  }
  if (!bad.ok()) {  // the daemon's fault: fail open
    r.Abort();
    s.indices.clear();
    s.offsets.clear();
    r.fail_open = bad;
    r.already_stored_chunks = 0;
    r.being_written_chunks = 0;
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
