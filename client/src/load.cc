// ChunkLease, and Client::Acquire and Client::Load built on it.
#include "client_impl.h"

namespace kvtier {

// ---- ChunkLease -----------------------------------------------------------

struct ChunkLease::State {
  std::shared_ptr<Connection> conn;
  std::function<void(std::shared_ptr<Connection>, uint64_t)> release;
  uint64_t lease_id = 0;  // 0 once released
  uint64_t payload_bytes = 0;
  uint64_t header_bytes = 0;
  std::vector<uint64_t> offsets;        // payload offsets in the arena
  std::vector<uint64_t> sequences;      // slot sequence numbers at lookup
  std::vector<uint64_t> hbm_offsets;    // payload offsets in the HBM pool; 0 = not in HBM
  std::vector<uint64_t> hbm_sequences;  // the HBM copies' own sequences; 0 = not in HBM
};

ChunkLease::ChunkLease() = default;
ChunkLease::~ChunkLease() { Release(); }
ChunkLease::ChunkLease(ChunkLease&&) noexcept = default;
ChunkLease& ChunkLease::operator=(ChunkLease&& other) noexcept {
  if (this != &other) {
    Release();
    state_ = std::move(other.state_);
    hbm_chunks = other.hbm_chunks;
    nvme_chunks = other.nvme_chunks;
    prefetched_chunks = other.prefetched_chunks;
    remote_chunks = other.remote_chunks;
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

uint64_t ChunkLease::sequence(size_t i) const { return state_->sequences[i]; }

uint64_t ChunkLease::hbm_payload_offset(size_t i) const { return state_->hbm_offsets[i]; }
uint64_t ChunkLease::hbm_sequence(size_t i) const { return state_->hbm_sequences[i]; }

const HbmPoolInfo* ChunkLease::hbm_pool() const {
  return state_ && state_->conn->hbm ? &*state_->conn->hbm : nullptr;
}

bool ChunkLease::held() const { return state_ && state_->lease_id != 0; }

void ChunkLease::Release() {
  if (!state_ || state_->lease_id == 0) return;
  state_->release(state_->conn, state_->lease_id);
  state_->lease_id = 0;
}

Result<ChunkLease> Client::Acquire(const NamespaceHandle& ns, std::span<const int32_t> tokens,
                                   size_t max_chunks, const PrefetchTicket* ticket, bool hbm,
                                   std::string_view request_id, size_t first_chunk) {
  if (!impl_->Knows(ns.id))
    return Status::InvalidArgument("namespace was not opened by this client");
  KVTIER_RETURN_IF_ERROR(CheckRequestId(request_id));
  const uint64_t pb = ns.layout.payload_bytes;
  max_chunks = std::min<size_t>(max_chunks, tokens.size() / ns.spec.chunk_tokens);
  ChunkLease lease;
  if (max_chunks == 0) return lease;
  auto deadline = impl_->CallDeadline();
  auto conn = impl_->GetFor(ns, deadline);
  if (!conn.ok()) {
    lease.fail_open = conn.status();
    return lease;
  }
  Connection& c = **conn;
  v1::LookupResponse resp;
  {
    // Another session's ticket (an engine's scheduler prefetched) is adopted
    // without a wait: its policy is that session's to apply.
    const bool adopt = ticket != nullptr && ticket->id != 0 && ticket->session_id != c.session_id &&
                       !request_id.empty();
    const bool take_over =
        adopt || (ticket != nullptr && WaitForPrefetch(*this, *ticket, c.session_id));
    if (ticket != nullptr) deadline = impl_->CallDeadline();  // the policy's wait comes first
    v1::LookupRequest req = MakeLookup(c, ns, /*acquire=*/true);
    req.set_max_chunks(static_cast<uint32_t>(std::min<size_t>(max_chunks, UINT32_MAX)));
    if (take_over) req.set_prefetch_ticket(ticket->id);
    req.set_adopt_ticket(adopt);
    req.set_hbm(hbm && c.hbm.has_value());
    req.set_request_id(std::string(request_id));
    req.set_first_chunk(static_cast<uint32_t>(std::min<size_t>(first_chunk, max_chunks)));
    const auto start = Clock::now();
    Status st = CallLookup(c, ns, deadline, req, tokens, &resp);
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
                           " chunk locations for " + std::to_string(resp.num_chunks()) + " chunks");
  }
  for (int i = 0; bad.ok() && i < resp.chunks_size(); ++i) {
    const v1::ChunkLocation& loc = resp.chunks(i);
    if (loc.payload_bytes() != pb || loc.payload_offset() < ns.layout.header_bytes ||
        !c.arena->Contains(loc.payload_offset(), pb)) {
      bad = Status::DataLoss("daemon returned a chunk location outside the arena");
      break;
    }
    const uint64_t hbm_off = loc.hbm_payload_offset();
    if (hbm_off != 0 && (!c.hbm || hbm_off < ns.layout.header_bytes ||
                         hbm_off > c.hbm->pool_bytes || pb > c.hbm->pool_bytes - hbm_off)) {
      bad = Status::DataLoss("daemon returned a chunk location outside its HBM pool");
      break;
    }
    s.offsets.push_back(loc.payload_offset());
    s.sequences.push_back(loc.sequence());
    s.hbm_offsets.push_back(hbm_off);
    s.hbm_sequences.push_back(hbm_off != 0 ? loc.hbm_sequence() : 0);
    lease.hbm_chunks += hbm_off != 0;
  }
  if (!bad.ok()) {
    lease.Release();
    s.offsets.clear();
    s.sequences.clear();
    s.hbm_offsets.clear();
    s.hbm_sequences.clear();
    lease.hbm_chunks = 0;
    lease.fail_open = bad;
    return lease;
  }
  const uint32_t n = resp.num_chunks();
  lease.nvme_chunks = std::min(n, resp.nvme_chunks());
  lease.prefetched_chunks = std::min(n, resp.prefetched_chunks());
  lease.remote_chunks = std::min(n, resp.remote_chunks());
  return lease;
}

Result<LoadResult> Client::Load(const NamespaceHandle& ns, std::span<const int32_t> tokens,
                                const ChunkReader& reader, size_t max_chunks,
                                const PrefetchTicket* ticket, std::string_view request_id) {
  auto acquired = Acquire(ns, tokens, max_chunks, ticket, /*hbm=*/false, request_id);
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
  // Chunks from NVMe (promoted by the lookup or by its prefetch ticket) are
  // the trailing ones: a lapse cuts them first.
  const uint32_t dram_chunks = n - lease.nvme_chunks;
  result.nvme_chunks = valid > dram_chunks ? valid - dram_chunks : 0;
  const uint32_t not_prefetched = n - lease.prefetched_chunks;
  result.prefetched_chunks = valid > not_prefetched ? valid - not_prefetched : 0;
  const uint32_t not_remote = n - lease.remote_chunks;
  result.remote_chunks = valid > not_remote ? valid - not_remote : 0;
  result.loaded_tokens = uint64_t{valid} * ns.spec.chunk_tokens;
  return result;
}

Result<LoadResult> Client::Load(const NamespaceHandle& ns, std::span<const int32_t> tokens,
                                std::span<std::byte> destination, const PrefetchTicket* ticket,
                                std::string_view request_id) {
  const uint64_t pb = ns.layout.payload_bytes;
  return Load(
      ns, tokens,
      [&](size_t i, std::span<const std::byte> payload) {
        std::memcpy(destination.data() + i * pb, payload.data(), pb);
        return Status::Ok();
      },
      destination.size() / pb, ticket, request_id);
}

}  // namespace kvtier
