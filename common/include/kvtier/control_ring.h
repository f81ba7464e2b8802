// The control ring: a session's shared-memory path for its hot calls
// (DESIGN.md, "Control ring"). gRPC stays for session open, admin, the other
// calls, and as the fallback when a ring is unavailable.
//
// One memfd per session, mapped by kvtierd and by the session's client:
//
//   offset 0           RingHeader (one 4 KiB page): magic, sizes, the
//                      submission queue (slot indexes) and its tail, the
//                      daemon's idle flag
//   4 KiB              RingSlot[kRingDepth]: each slot's submission entry,
//                      completion entry and completion word
//   16 KiB + i * kRingSlotDataBytes
//                      slot i's data area: the request's token ids and
//                      request id in; the answer's chunk locations (or the
//                      error text) out
//
// ReleaseRead goes the same way, and the client does not wait for its answer:
// the slot is free again once it is answered. One queue for both keeps a
// thread's release ahead of its next Lookup, as on one gRPC connection.
//
// A call: the client takes a free slot (its own bookkeeping), writes the
// tokens and the Submission (with a new `seq`), appends the slot index to
// `sq` and bumps `sq_tail`, waking the daemon (FUTEX_WAKE on sq_tail) when
// `daemon_idle` is set. The daemon copies the Submission and the token ids out
// before it looks at them, answers into the slot's Completion and data area,
// then swaps the slot's `done` word from 0 to `seq` and wakes it
// (RingComplete). A client past its deadline swaps `done` from 0 to
// kRingGivenUp instead (RingGiveUp): one word decides whether the answer was
// taken or must be undone. Completions are
// thus indexed by slot, not queued: a waiter needs no demultiplexer, and a
// Lookup that promotes from NVMe may finish after later calls.
//
// kvtierd treats all of it as hostile (DecodeSubmission): a client that scribbles
// over its ring gets errors or nothing, and other sessions are not affected.
#pragma once

#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>

#include "kvtier/status.h"

namespace kvtier {

inline constexpr uint64_t kRingMagic = 0x31474E4952545650ULL;  // "PVTRING1"
// 2: `done` decides a call's fate (no claim word); 3: RingLocation.hbm_sequence,
// RingSubmission.first_chunk; 4: the flag kRingAdoptTicket.
inline constexpr uint32_t kRingVersion = 4;
inline constexpr uint32_t kRingDepth = 32;  // calls in flight per session on the ring
// Per slot: up to 512K token ids in, or 65,536 chunk locations out.
inline constexpr uint64_t kRingSlotDataBytes = uint64_t{2} << 20;
inline constexpr uint64_t kRingSlotsOffset = 4096;
inline constexpr uint64_t kRingDataOffset = 16384;
inline constexpr uint64_t kRingBytes = kRingDataOffset + kRingDepth * kRingSlotDataBytes;
inline constexpr uint32_t kRingMaxRequestIdBytes = 256;
inline constexpr uint32_t kRingGivenUp = 0xFFFFFFFF;    // RingSlot::done; never a seq
inline constexpr uint32_t kRingMaxMessageBytes = 1024;  // error text, truncated to this

// Lookup and ReleaseRead are carried in the entry's own fields (a Lookup's
// token ids in the data area). The others carry their v1 request message,
// serialized, in the data area (`message_bytes`; its session_id and epoch are
// the ring's own), and are answered with the v1 response message there.
enum class RingOp : uint32_t {
  kLookup = 1,
  kReleaseRead = 2,
  kReserveWrite = 3,
  kCommitWrite = 4,
  kAbortWrite = 5,
  kPrefetchStatus = 6,
};
inline constexpr uint32_t kRingAcquire = 1;      // Lookup: lease the hits, return their locations
inline constexpr uint32_t kRingHbm = 2;          // Lookup: LookupRequest.hbm
inline constexpr uint32_t kRingAdoptTicket = 4;  // Lookup: LookupRequest.adopt_ticket
inline constexpr uint32_t kRingKnownFlags = kRingAcquire | kRingHbm | kRingAdoptTicket;

// Written by the client into its slot before it publishes the slot.
struct RingSubmission {
  uint32_t seq = 0;  // the client's; echoed in RingCompletion.seq and RingSlot.done
  uint32_t op = 0;   // RingOp
  uint32_t flags = 0;
  uint32_t max_chunks = 0;        // as LookupRequest.max_chunks
  uint32_t token_count = 0;       // int32 token ids at the start of the data area
  uint32_t first_chunk = 0;       // as LookupRequest.first_chunk
  uint64_t prefetch_ticket = 0;   // as LookupRequest.prefetch_ticket
  uint32_t request_id_bytes = 0;  // the request id follows the token ids
  uint32_t message_bytes = 0;     // ops 3-6: the serialized request at the data area's start
  uint8_t namespace_id[16] = {};
  uint64_t lease_id = 0;  // ReleaseRead: the lease to end
};
static_assert(sizeof(RingSubmission) == 64);

// Written by the daemon. `code` is a StatusCode; on error the data area holds
// `message_bytes` of text; else a Lookup's `location_count` RingLocations, or
// ops 3-6's serialized response (`message_bytes`).
struct RingCompletion {
  uint32_t seq = 0;
  int32_t code = 0;
  uint32_t message_bytes = 0;
  uint32_t num_chunks = 0;
  uint32_t nvme_chunks = 0;
  uint32_t prefetched_chunks = 0;
  uint32_t hbm_chunks = 0;
  uint32_t location_count = 0;
  uint64_t lease_id = 0;
  uint64_t lease_ttl_ms = 0;
  uint64_t cached_tokens = 0;
  uint32_t remote_chunks = 0;
  uint32_t pad = 0;
};
static_assert(sizeof(RingCompletion) == 64);

// One leased chunk, as v1::ChunkLocation.
struct RingLocation {
  uint64_t payload_offset = 0;
  uint64_t payload_bytes = 0;
  uint64_t sequence = 0;
  uint64_t hbm_payload_offset = 0;
  uint64_t hbm_sequence = 0;
};
inline constexpr uint32_t kRingMaxLocations =
    static_cast<uint32_t>(kRingSlotDataBytes / sizeof(RingLocation));

struct alignas(64) RingHeader {
  uint64_t magic = kRingMagic;
  uint32_t version = kRingVersion;
  uint32_t depth = kRingDepth;
  uint64_t slot_data_bytes = kRingSlotDataBytes;
  uint64_t session_id = 0;
  alignas(64) std::atomic<uint32_t> sq_tail{0};      // the client's; the daemon's futex word
  alignas(64) std::atomic<uint32_t> daemon_idle{0};  // 1 while the daemon sleeps on sq_tail
  // 1 once kvtierd no longer serves this ring (it is stopping, or gave up on
  // the ring): the client stops waiting and uses gRPC.
  std::atomic<uint32_t> closed{0};
  alignas(64) std::atomic<uint32_t> sq_head{0};           // the daemon's (what it has taken)
  alignas(64) std::atomic<uint32_t> sq[kRingDepth] = {};  // slot indexes, at tail % depth
};
static_assert(sizeof(RingHeader) <= kRingSlotsOffset);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

struct alignas(64) RingSlot {
  RingSubmission submission;
  RingCompletion completion;
  // The call's fate, set 0 by the client before it publishes the call; the
  // client's futex. kvtierd, its answer written, swaps 0 for the call's seq; a
  // client that gives up swaps 0 for kRingGivenUp. Whoever swaps first decides:
  // when the client did, kvtierd undoes what the call did (ends its lease,
  // aborts its reservation) and then stores the seq anyway, which frees the slot.
  alignas(64) std::atomic<uint32_t> done{0};
};
static_assert(kRingSlotsOffset + kRingDepth * sizeof(RingSlot) <= kRingDataOffset);

// kvtierd, its answer to `seq` written into `slot`: publishes it and wakes the
// client. False when the client had given up on the call first; the caller
// then undoes the call (the slot is free for the client either way).
bool RingComplete(RingSlot& slot, uint32_t seq);
// The client, past its deadline: true when it gave up on the slot's call
// before the answer came (kvtierd will undo the call); false when the answer
// is there (`done` holds the call's seq).
bool RingGiveUp(RingSlot& slot);

// A mapped ring. Move-only; unmaps (and closes its fd) when destroyed.
class RingMemory {
 public:
  // A fresh ring for `session_id` (kvtierd). Errors: IO_ERROR from memfd/mmap.
  static Result<RingMemory> Create(uint64_t session_id);
  // Maps `fd` (takes it) and checks its header: size, magic, version, depth and
  // `session_id` (the client). Errors: DATA_LOSS naming what differs, IO_ERROR.
  static Result<RingMemory> Map(int fd, uint64_t session_id);

  RingMemory(RingMemory&& other) noexcept;
  RingMemory& operator=(RingMemory&& other) noexcept;
  RingMemory(const RingMemory&) = delete;
  RingMemory& operator=(const RingMemory&) = delete;
  ~RingMemory();

  int fd() const { return fd_; }
  RingHeader& header() const { return *reinterpret_cast<RingHeader*>(base_); }
  RingSlot& slot(uint32_t i) const {
    return reinterpret_cast<RingSlot*>(base_ + kRingSlotsOffset)[i % kRingDepth];
  }
  std::span<uint8_t> data(uint32_t i) const {
    return {base_ + kRingDataOffset + (i % kRingDepth) * kRingSlotDataBytes, kRingSlotDataBytes};
  }

 private:
  RingMemory(uint8_t* base, int fd) : base_(base), fd_(fd) {}
  static Result<uint8_t*> MapShared(int fd);  // closes `fd` on failure
  uint8_t* base_ = nullptr;
  int fd_ = -1;
};

// A call taken off the ring, copied out of shared memory and checked: a
// Lookup (the fields below), a ReleaseRead (`lease_id`), or another op's
// serialized request (`message`, still to be parsed).
struct RingCall {
  RingOp op = RingOp::kLookup;
  uint64_t lease_id = 0;
  std::string message;
  uint32_t seq = 0;
  bool acquire = false;
  bool hbm = false;
  uint32_t max_chunks = 0;  // at most kRingMaxLocations with acquire (the answer must fit)
  uint32_t first_chunk = 0;
  uint64_t prefetch_ticket = 0;
  bool adopt_ticket = false;
  std::string namespace_id;  // 16 bytes
  std::string tokens;        // token_count int32 ids, as LookupRequest.tokens
  std::string request_id;
};

// Decodes slot `entry` (already copied out of the ring) with `data`, the
// slot's shared data area, copying what it needs before checking it. Errors:
// INVALID_ARGUMENT naming the field (an unknown op or flag, a count or length
// past the data area, a ReleaseRead with tokens). The daemon parses a
// `message` and CacheCore checks the rest, as for gRPC.
Result<RingCall> DecodeSubmission(const RingSubmission& entry, std::span<const uint8_t> data);

// Whether `code`, read from the other side of a ring or its socket, is a
// StatusCode (OK included).
inline bool RingStatusCodeKnown(int32_t code) {
  return (code >= 0 && code <= static_cast<int32_t>(StatusCode::kDataLoss)) ||
         code == static_cast<int32_t>(StatusCode::kIOError);
}

// One step of a spin-wait on a ring word: sched_yield, so that with more
// waiters than cores (8 clients and kvtierd on 2 cores) a thread with work
// gets the core instead of a spinner (`kvtier-bench scale`: PAUSE loops there
// gave 0.5x a lone client's lookups/s and a p99 near 1 ms; PAUSE for the
// first 5 us, then yields, was no better). With nothing else to run it
// returns at once.
inline void RingSpinStep() { sched_yield(); }

// Blocks while `*word == expected`, at most `timeout` (a process-shared
// futex). Returns early on a wake, a signal or a changed value.
void RingFutexWait(std::atomic<uint32_t>& word, uint32_t expected,
                   std::chrono::nanoseconds timeout);
void RingFutexWake(std::atomic<uint32_t>& word);
// Blocks while `*words[i] == expected[i]` for every i, at most `timeout`
// (futex_waitv, Linux 5.16+; a kernel without it sleeps at most 200 us
// instead). At most kRingWaitAnyMax words.
inline constexpr size_t kRingWaitAnyMax = 128;
void RingFutexWaitAny(std::span<std::atomic<uint32_t>* const> words,
                      std::span<const uint32_t> expected, std::chrono::nanoseconds timeout);

// Handing a session its ring: the client connects to `<socket>.ring`, sends
// RingHello, and gets one RingAnnouncement with the ring's fd attached.
inline constexpr uint64_t kRingHelloMagic = 0x4F4C4C4548525650ULL;  // "PVRHELLO"
struct RingHello {
  uint64_t magic = kRingHelloMagic;
  uint32_t version = kRingVersion;
  uint32_t reserved = 0;
  uint64_t session_id = 0;
  char session_token[32] = {};  // SessionOpened.session_token
};
struct RingAnnouncement {
  uint64_t magic = kRingMagic;
  int32_t code = 0;  // StatusCode; no fd unless OK
  char message[100] = {};
};
std::string RingSocketPath(const std::string& socket_path);

// The client's side: the ring fd of session `session_id` (caller owns it).
// Errors: UNAVAILABLE (no ring socket: an older kvtierd), the daemon's refusal
// (PERMISSION_DENIED for a wrong token, FAILED_PRECONDITION for an unknown
// session), DATA_LOSS for a malformed answer.
Result<int> RequestRingFd(const std::string& socket_path, uint64_t session_id,
                          std::string_view session_token, int timeout_ms);

}  // namespace kvtier
