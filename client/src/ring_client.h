// The client's end of the control ring (kvtier/control_ring.h). Not installed.
//
// Thread-safety: thread-safe. Up to kRingDepth calls are in flight at once;
// a call that finds no free slot, or does not fit one, is the caller's to
// send over gRPC (Lookup returns nullopt).
#pragma once

#include <chrono>
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "kvtier/chunk_key.h"
#include "kvtier/control_ring.h"
#include "kvtier/v1/kvtier.pb.h"

namespace kvtier::client_internal {

class RingClient {
 public:
  explicit RingClient(RingMemory mem);

  struct LookupArgs {
    const NamespaceId* ns = nullptr;
    std::span<const int32_t> tokens;
    uint32_t chunk_tokens = 1;  // the namespace's: bounds the answer's size
    bool acquire = false;
    bool hbm = false;
    uint32_t max_chunks = 0;
    uint64_t prefetch_ticket = 0;
    std::string_view request_id;
    uint32_t first_chunk = 0;
    bool adopt_ticket = false;
  };
  // Runs a Lookup on the ring and fills `resp` as the Lookup RPC would; the
  // status is the daemon's, DEADLINE_EXCEEDED when it did not answer by
  // `deadline`, or UNAVAILABLE when `session_alive` turns false meanwhile
  // (looked at every 10 ms: kvtierd ended the session, or exited). nullopt:
  // the ring cannot take this call (all slots busy, or the prompt or its
  // answer does not fit a slot); nothing was sent.
  std::optional<Status> Lookup(const LookupArgs& args,
                               std::chrono::steady_clock::time_point deadline,
                               const std::function<bool()>& session_alive,
                               v1::LookupResponse* resp);

  // Sends a ReleaseRead of `lease_id` without waiting for its answer (errors
  // are not the caller's: the session's end or the TTL ends a lease anyway).
  // False: no free slot; nothing was sent.
  bool ReleaseRead(uint64_t lease_id);

  // Runs op `op` (ReserveWrite to PrefetchStatus) with its v1 request `req`
  // (session_id and epoch are the ring's) and parses the answer into `resp`.
  // Statuses and nullopt as for Lookup.
  std::optional<Status> Call(RingOp op, const google::protobuf::MessageLite& req,
                             std::chrono::steady_clock::time_point deadline,
                             const std::function<bool()>& session_alive,
                             google::protobuf::MessageLite* resp);

 private:
  // Waits for the answer to `seq` in `slot` and copies its completion entry.
  // OK: answered (the daemon's own status is in `c`); else the slot stays
  // with the call (given up on, or handed back when the answer is malformed).
  Status Wait(uint32_t slot, uint32_t seq, std::chrono::steady_clock::time_point deadline,
              const std::function<bool()>& session_alive, RingCompletion* c);
  std::optional<uint32_t> TakeSlot();
  // Sets `entry.seq`, writes `entry` into `slot` (its data already there) and
  // appends the slot to the submission queue.
  void Publish(uint32_t slot, RingSubmission& entry);
  void GiveBack(uint32_t slot);

  RingMemory mem_;
  std::mutex mu_;
  std::vector<uint32_t> free_;  // GUARDED_BY(mu_)
  // Calls not waited for (releases, calls past their deadline): each slot is
  // free again once the daemon answered its seq. One left unanswered for
  // kStuckAfter means kvtierd is not serving the ring (stopped, say): calls
  // then go over gRPC, whose watchdog ends the connection (CallWatchdog).
  struct Unanswered {
    uint32_t slot;
    uint32_t seq;
    std::chrono::steady_clock::time_point since;
  };
  static constexpr std::chrono::milliseconds kStuckAfter{100};
  std::vector<Unanswered> unanswered_;  // GUARDED_BY(mu_)
  std::mutex submit_mu_;                // one producer at a time on the submission queue
  uint32_t next_seq_ = 1;               // GUARDED_BY(submit_mu_)
};

}  // namespace kvtier::client_internal
