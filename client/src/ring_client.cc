#include "ring_client.h"

#include <cstring>

namespace kvtier::client_internal {

namespace {

using Clock = std::chrono::steady_clock;

// How long a caller spins on its answer before it sleeps on the slot's futex:
// a DRAM-only Lookup is answered within this on an idle machine.
constexpr auto kSpin = std::chrono::microseconds(50);

}  // namespace

RingClient::RingClient(RingMemory mem) : mem_(std::move(mem)) {
  for (uint32_t i = kRingDepth; i > 0; --i) free_.push_back(i - 1);
}

std::optional<uint32_t> RingClient::TakeSlot() {
  if (mem_.header().closed.load() != 0) return std::nullopt;  // not served: use gRPC
  std::lock_guard lock(mu_);
  // A slot whose call nobody waits for is free again once the daemon answered it.
  const auto now = Clock::now();
  bool stuck = false;
  for (auto it = unanswered_.begin(); it != unanswered_.end();) {
    if (mem_.slot(it->slot).done.load(std::memory_order_acquire) == it->seq) {
      free_.push_back(it->slot);
      it = unanswered_.erase(it);
    } else {
      stuck = stuck || now - it->since > kStuckAfter;
      ++it;
    }
  }
  if (stuck || free_.empty()) return std::nullopt;
  const uint32_t slot = free_.back();
  free_.pop_back();
  return slot;
}

void RingClient::GiveBack(uint32_t slot) {
  std::lock_guard lock(mu_);
  free_.push_back(slot);
}

void RingClient::Publish(uint32_t slot, RingSubmission& entry) {
  RingHeader& h = mem_.header();
  std::lock_guard lock(submit_mu_);
  entry.seq = next_seq_++;
  if (next_seq_ == kRingGivenUp) next_seq_ = 1;  // neither 0 (pending) nor kRingGivenUp
  RingSlot& s = mem_.slot(slot);
  s.done.store(0, std::memory_order_relaxed);  // pending; a seq from 2^32 calls ago cannot match
  std::memcpy(&s.submission, &entry, sizeof(entry));
  const uint32_t tail = h.sq_tail.load(std::memory_order_relaxed);
  h.sq[tail % kRingDepth].store(slot, std::memory_order_relaxed);
  h.sq_tail.store(tail + 1);  // seq_cst: ordered before the daemon_idle load
  if (h.daemon_idle.load() != 0) RingFutexWake(h.sq_tail);
}

bool RingClient::ReleaseRead(uint64_t lease_id) {
  const auto slot = TakeSlot();
  if (!slot) return false;
  RingSubmission entry;
  entry.op = static_cast<uint32_t>(RingOp::kReleaseRead);
  entry.lease_id = lease_id;
  Publish(*slot, entry);
  std::lock_guard lock(mu_);
  unanswered_.push_back({*slot, entry.seq, Clock::now()});
  return true;
}

Status RingClient::Wait(uint32_t slot, uint32_t seq, Clock::time_point deadline,
                        const std::function<bool()>& session_alive, RingCompletion* c) {
  RingSlot& s = mem_.slot(slot);
  const RingHeader& h = mem_.header();
  const auto spin_until = Clock::now() + kSpin;
  for (;;) {
    const uint32_t done = s.done.load(std::memory_order_acquire);
    if (done == seq) break;
    const auto now = Clock::now();
    const bool closed = h.closed.load() != 0;
    const bool gone = closed || (now >= spin_until && !session_alive());
    if (now >= deadline || gone) {
      if (!RingGiveUp(s)) {
        if (s.done.load(std::memory_order_acquire) == seq) break;  // answered meanwhile
        GiveBack(slot);
        return Status::DataLoss("malformed control ring answer from kvtierd");
      }
      std::lock_guard lock(mu_);
      unanswered_.push_back({slot, seq, now});  // kvtierd undoes the call if it ever answers it
      if (closed) return Status::Unavailable("kvtierd stopped serving the control ring");
      if (gone) return Status::Unavailable("kvtierd ended the session during a control ring call");
      return Status::DeadlineExceeded(
          "kvtierd did not answer on the control ring within the "
          "deadline");
    }
    if (now < spin_until) {
      RingSpinStep();
    } else {
      RingFutexWait(s.done, done,
                    std::min<Clock::duration>(deadline - now, std::chrono::milliseconds(10)));
    }
  }
  std::memcpy(c, &s.completion, sizeof(*c));
  if (c->seq == seq && RingStatusCodeKnown(c->code) &&
      (c->code == 0 || c->message_bytes <= kRingMaxMessageBytes)) {
    return Status::Ok();
  }
  GiveBack(slot);
  return Status::DataLoss("malformed control ring answer from kvtierd");
}

std::optional<Status> RingClient::Call(RingOp op, const google::protobuf::MessageLite& req,
                                       Clock::time_point deadline,
                                       const std::function<bool()>& session_alive,
                                       google::protobuf::MessageLite* resp) {
  const size_t bytes = req.ByteSizeLong();
  if (bytes > kRingSlotDataBytes) return std::nullopt;
  const auto taken = TakeSlot();
  if (!taken) return std::nullopt;
  const uint32_t slot = *taken;
  const std::span<uint8_t> data = mem_.data(slot);
  req.SerializeToArray(data.data(), static_cast<int>(bytes));
  RingSubmission entry;
  entry.op = static_cast<uint32_t>(op);
  entry.message_bytes = static_cast<uint32_t>(bytes);
  Publish(slot, entry);
  RingCompletion c;
  Status st = Wait(slot, entry.seq, deadline, session_alive, &c);
  if (!st.ok()) return st;
  if (c.code != 0) {
    st = Status(static_cast<StatusCode>(c.code),
                std::string(reinterpret_cast<const char*>(data.data()), c.message_bytes));
  } else if (c.message_bytes > kRingSlotDataBytes ||
             !resp->ParseFromArray(data.data(), static_cast<int>(c.message_bytes))) {
    st = Status::DataLoss("malformed control ring answer from kvtierd");
  }
  GiveBack(slot);
  return st;
}

std::optional<Status> RingClient::Lookup(const LookupArgs& args, Clock::time_point deadline,
                                         const std::function<bool()>& session_alive,
                                         v1::LookupResponse* resp) {
  const uint64_t token_bytes = args.tokens.size_bytes();
  if (token_bytes + args.request_id.size() > kRingSlotDataBytes ||
      args.request_id.size() > kRingMaxRequestIdBytes || args.chunk_tokens == 0) {
    return std::nullopt;
  }
  uint64_t max_answer = args.tokens.size() / args.chunk_tokens;
  if (args.max_chunks != 0) max_answer = std::min<uint64_t>(max_answer, args.max_chunks);
  if (args.acquire && max_answer > kRingMaxLocations) return std::nullopt;
  const auto taken = TakeSlot();
  if (!taken) return std::nullopt;
  const uint32_t slot = *taken;
  const std::span<uint8_t> data = mem_.data(slot);

  RingSubmission entry;
  entry.op = static_cast<uint32_t>(RingOp::kLookup);
  entry.flags = (args.acquire ? kRingAcquire : 0) | (args.hbm ? kRingHbm : 0) |
                (args.adopt_ticket ? kRingAdoptTicket : 0);
  entry.max_chunks = args.max_chunks;
  entry.token_count = static_cast<uint32_t>(args.tokens.size());
  entry.first_chunk = args.first_chunk;
  entry.prefetch_ticket = args.prefetch_ticket;
  entry.request_id_bytes = static_cast<uint32_t>(args.request_id.size());
  args.ns->ToBytes(reinterpret_cast<std::byte*>(entry.namespace_id));
  if (token_bytes != 0) std::memcpy(data.data(), args.tokens.data(), token_bytes);
  if (!args.request_id.empty()) {  // memcpy from the null of an empty span is undefined
    std::memcpy(data.data() + token_bytes, args.request_id.data(), args.request_id.size());
  }
  Publish(slot, entry);
  RingCompletion c;
  Status st = Wait(slot, entry.seq, deadline, session_alive, &c);
  if (!st.ok()) return st;
  if (c.location_count > kRingMaxLocations || c.message_bytes > kRingMaxMessageBytes) {
    st = Status::DataLoss("malformed control ring answer from kvtierd");
  } else if (c.code != 0) {
    st = Status(static_cast<StatusCode>(c.code),
                std::string(reinterpret_cast<const char*>(data.data()), c.message_bytes));
  } else {
    resp->Clear();
    resp->set_num_chunks(c.num_chunks);
    resp->set_cached_tokens(c.cached_tokens);
    resp->set_lease_id(c.lease_id);
    resp->set_lease_ttl_ms(c.lease_ttl_ms);
    resp->set_nvme_chunks(c.nvme_chunks);
    resp->set_prefetched_chunks(c.prefetched_chunks);
    resp->set_hbm_chunks(c.hbm_chunks);
    resp->set_remote_chunks(c.remote_chunks);
    resp->mutable_chunks()->Reserve(static_cast<int>(c.location_count));
    for (uint32_t i = 0; i < c.location_count; ++i) {
      RingLocation loc;
      std::memcpy(&loc, data.data() + i * sizeof(RingLocation), sizeof(loc));
      v1::ChunkLocation* out = resp->add_chunks();
      out->set_payload_offset(loc.payload_offset);
      out->set_payload_bytes(loc.payload_bytes);
      out->set_sequence(loc.sequence);
      out->set_hbm_payload_offset(loc.hbm_payload_offset);
      out->set_hbm_sequence(loc.hbm_sequence);
    }
  }
  GiveBack(slot);
  return st;
}

}  // namespace kvtier::client_internal
