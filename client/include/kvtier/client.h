// kvtier client SDK: what an inference engine links to store and load KV.
//
// A Client holds one Session stream to kvtierd (the daemon ends this client's
// leases and reservations when it breaks), maps the daemon's DRAM arena, and
// moves chunk payloads through that shared memory; gRPC carries only control.
//
// Failure model (DESIGN.md): the cache fails open. When the daemon is down,
// slower than `deadline`, or answers with an error, Lookup/Load report zero
// cached tokens and Store drops the write; the reason is in `fail_open`. The
// engine then recomputes. A call never blocks past its deadline, whatever the
// daemon does (stopped, accepting and never answering, slow): connecting,
// registering the namespace and the call's RPC share one deadline, and a call
// waits for another thread's connection attempt only until its own deadline.
// The exceptions: Store's commit gets a deadline of its own after the writes,
// and a Load with a prefetch ticket first waits as the ticket's policy says.
// Close() drops queued lease releases (ending the session ends those leases)
// and returns within one deadline. After a daemon restart the
// client reconnects (at most every `reconnect_interval`), remaps the new arena
// epoch and re-registers its namespaces by itself.
//
// Errors that are the caller's own (a bad NamespaceSpec, a namespace not opened
// by this client, a destination too small) are returned as a non-OK Result.
//
// Thread-safety: a Client is thread-safe; calls from several threads proceed in
// parallel. Several processes may share one daemon and one arena.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/chunk_key.h"
#include "kvtier/namespace_spec.h"
#include "kvtier/slot_image.h"
#include "kvtier/status.h"

namespace kvtier {

struct ClientOptions {
  // kvtierd's gRPC socket. Default: "" = ${XDG_RUNTIME_DIR:-/tmp}/kvtier/kvtierd.sock.
  std::string socket_path;
  // Deadline of each call (see the failure model above). Default: 100 ms.
  std::chrono::milliseconds deadline{100};
  // Deadline of the first connection in Connect() (session + arena). Default: 2 s.
  std::chrono::milliseconds connect_timeout{2000};
  // Least time between two reconnection attempts. Default: 100 ms.
  std::chrono::milliseconds reconnect_interval{100};
  // Name shown in the daemon's logs, at most 256 bytes. Default: "kvtier-client".
  std::string client_name = "kvtier-client";
  // Send Lookups, lease releases, ReserveWrite, CommitWrite, AbortWrite and
  // PrefetchStatus over the session's shared-memory control ring (DESIGN.md,
  // "Control ring") instead of gRPC, when kvtierd hands one over; gRPC stays
  // the fallback (no ring, all 32 ring slots busy, a request over 2 MiB such
  // as a prompt over 512K tokens, a ring kvtierd stopped serving). Same
  // answers and errors either way. The environment variable
  // KVTIER_CONTROL_RING=0 (or false, off, no, in any case) turns it off; a
  // value neither off nor on (1, true, on, yes) is warned about. Default: true.
  bool control_ring = true;
};

// A namespace this client opened: its id (digest), spec and slot sizes.
struct NamespaceHandle {
  NamespaceId id;
  NamespaceSpec spec;
  SlotLayout layout;  // layout.payload_bytes is the size of one chunk payload
};

struct LookupResult {
  uint64_t cached_tokens = 0;  // num_chunks * chunk_tokens
  uint32_t num_chunks = 0;     // leading full chunks cached
  Status fail_open;            // non-OK when the cache failed open (reported a miss)
};

struct LoadResult {
  uint64_t loaded_tokens = 0;  // num_chunks * chunk_tokens, copied to the destination
  uint32_t num_chunks = 0;
  uint32_t nvme_chunks = 0;        // of num_chunks, the trailing ones the daemon promoted from NVMe
  uint32_t prefetched_chunks = 0;  // of num_chunks, those a Prefetch promoted from NVMe in time
  // Of num_chunks, the trailing ones the daemon read from the remote tier (by
  // the Lookup or its Prefetch; counted in nvme_chunks or prefetched_chunks too).
  uint32_t remote_chunks = 0;
  std::chrono::microseconds lookup_time{0};  // the Lookup-with-lease RPC alone
  Status fail_open;
};

struct StoreResult {
  uint32_t stored_chunks = 0;          // written and committed now
  uint32_t already_stored_chunks = 0;  // cached before
  // Not written by this call: another client's reservation is writing them
  // (stored when it commits, if it does). Not counted as stored.
  uint32_t being_written_chunks = 0;
  uint32_t dropped_chunks = 0;  // not stored: no space, or parent evicted meanwhile
  uint64_t stored_bytes = 0;    // payload bytes written into the arena
  Status fail_open;             // non-OK when the write was dropped by a failure
};

// What a Load given a PrefetchTicket waits for (the prefetch policies of SGLang
// HiCache). Whatever the policy, what is loaded is a contiguous prefix; the
// rest is a miss that the engine recomputes.
enum class PrefetchPolicy {
  kBestEffort,    // take what is ready at load time; never wait
  kWaitComplete,  // wait until the prefetch is done (all ready, or stopped early; with
                  // to_hbm, until nothing more goes into HBM)
  kTimeout,       // wait until done, or timeout_base + timeout_per_1k_tokens per 1,000
                  // prompt tokens after the Prefetch call, whichever comes first
};

struct PrefetchOptions {
  PrefetchPolicy policy = PrefetchPolicy::kBestEffort;
  // The daemon holds the prefetched chunks this long at most (1 ms..600 s).
  // Default: 10 s.
  std::chrono::milliseconds deadline{10000};
  // kTimeout: Default 1 s + 250 ms per 1,000 tokens (HiCache's defaults).
  std::chrono::milliseconds timeout_base{1000};
  std::chrono::milliseconds timeout_per_1k_tokens{250};
  // Also have the daemon copy the prefix into its HBM pool once in DRAM
  // (Prefetch target=hbm), for a LayerwiseLoader that reads HBM; the
  // wait_complete and timeout policies then also wait for those copies. The
  // daemon must run with --hbm-bytes; otherwise the prefetch fails open.
  bool to_hbm = false;
};

// kvtierd's HBM pool (kvtierd --hbm-bytes): device memory it exported with
// CUDA IPC; GpuArena::Pool opens it. Only a GPU reader on the same machine can
// use it; Load and the host-side calls never do.
struct HbmPoolInfo {
  std::string ipc_handle;  // opaque bytes for gpu::Runtime::OpenExported
  uint64_t pool_bytes = 0;
  std::string backend;  // "cuda", or "host" (emulation, tests only)
  int device = 0;       // the daemon's CUDA device ordinal
  uint64_t epoch = 0;   // the arena epoch of the daemon run that exported it
};

// A prefetch in progress, from Prefetch(); hand it to Load. Copyable. A ticket
// is tied to the session it was issued on: after a reconnect, Load ignores it.
struct PrefetchTicket {
  uint64_t id = 0;  // 0 when nothing is cached or the call failed open
  uint32_t total_chunks =
      0;  // cached prefix: the DRAM chunks, the NVMe chunks, then the remote ones
  uint32_t nvme_chunks = 0;  // of total_chunks, those being promoted from NVMe
  uint32_t remote_chunks =
      0;                      // of total_chunks, the last ones, being promoted from the remote tier
  uint32_t ready_chunks = 0;  // in DRAM at the call
  PrefetchOptions options;
  std::chrono::steady_clock::time_point wait_until;  // the latest a Load waits until
  uint64_t session_id = 0;                           // the session it belongs to
  Status fail_open;                                  // non-OK when the cache failed open
};

struct PrefetchProgress {
  uint32_t ready_chunks = 0;  // leading chunks in DRAM, held for the Load
  uint32_t total_chunks = 0;
  uint32_t hbm_chunks = 0;  // leading chunks also in HBM (PrefetchOptions::to_hbm)
  bool hbm_done = false;    // to_hbm: no more will go into HBM (the pool may be full)
  bool done = false;        // no more will become ready
  Status fail_open;         // non-OK when the ticket is gone or the daemon did not answer
};

// Reads chunk `chunk_index` (0-based) of a load: `payload` (layout.payload_bytes)
// lies in the shared arena and is valid only during the call. A non-OK return
// ends the load and is returned by Load.
using ChunkReader = std::function<Status(size_t chunk_index, std::span<const std::byte> payload)>;

// Writes chunk `chunk_index` (0-based over the prompt's full chunks) into
// `payload` (exactly layout.payload_bytes, in the shared arena). A non-OK
// return aborts the whole write.
using ChunkWriter = std::function<Status(size_t chunk_index, std::span<std::byte> payload)>;

class Client;
class Arena;

// A lease on the cached prefix of a prompt, for copies that outlive one call
// (a layerwise loader's GPU copies run while the engine computes). The chunks'
// payloads stay in place in the shared arena until Release() (or the
// destructor), which ends the lease in the background. After the copies, call
// ValidChunks() before trusting them. Must not outlive its Client. Movable.
class ChunkLease {
 public:
  ChunkLease();
  ~ChunkLease();
  ChunkLease(ChunkLease&&) noexcept;
  ChunkLease& operator=(ChunkLease&&) noexcept;

  // Leading chunks leased (0 on a miss or a fail-open).
  uint32_t num_chunks() const;
  // Chunk i's payload (layout.payload_bytes) in the shared arena. REQUIRES: i < num_chunks().
  std::span<const std::byte> payload(size_t i) const;
  // After copying: how many leading chunks still hold what they held when
  // leased (a lease that lapsed mid-copy, past its TTL, shortens the prefix).
  uint32_t ValidChunks() const;
  // Ends the lease (in the background). Idempotent.
  void Release();
  // True from a hit until Release() (the payloads are pinned for this lease).
  bool held() const;
  // The arena mapping the payloads lie in (to register it with a GPU runtime).
  std::shared_ptr<Arena> mapping() const;
  // Chunk i's DRAM slot sequence number at lookup.
  uint64_t sequence(size_t i) const;
  // Acquired with `hbm`: the offset of chunk i's payload in the daemon's HBM
  // pool (hbm_pool()), leased with its DRAM copy; 0 when it is not in HBM.
  uint64_t hbm_payload_offset(size_t i) const;
  // The sequence number of chunk i's HBM copy at lookup (its own, not the
  // DRAM slot's); 0 when it is not in HBM.
  uint64_t hbm_sequence(size_t i) const;
  // The pool those offsets are in; nullptr when the daemon has no HBM tier.
  const HbmPoolInfo* hbm_pool() const;

  uint32_t hbm_chunks = 0;         // of num_chunks, those with an HBM copy
  uint32_t nvme_chunks = 0;        // of num_chunks, the trailing ones promoted from NVMe
  uint32_t prefetched_chunks = 0;  // of num_chunks, those a Prefetch promoted in time
  uint32_t remote_chunks = 0;      // of num_chunks, the trailing ones read from the remote tier
  std::chrono::microseconds lookup_time{0};  // the Lookup-with-lease RPC
  Status fail_open;                          // non-OK when the cache failed open (a miss)

 private:
  friend class Client;
  struct State;
  std::unique_ptr<State> state_;
};

// Slots reserved for the chunks of a prompt not yet stored, for writes that
// outlive one call (a layerwise storer copies layer by layer). Write every
// payload, then Commit(); Abort() (or the destructor) drops them, and nothing
// half-written ever becomes visible. Must not outlive its Client. Movable.
class ChunkReservation {
 public:
  ChunkReservation();
  ~ChunkReservation();
  ChunkReservation(ChunkReservation&&) noexcept;
  ChunkReservation& operator=(ChunkReservation&&) noexcept;

  // Chunks to write, k = 0 .. size()-1, in prompt order.
  size_t size() const;
  // Index of reserved chunk k among the prompt's full chunks.
  size_t chunk_index(size_t k) const;
  // Where to write it: layout.payload_bytes in the shared arena.
  std::span<std::byte> payload(size_t k) const;
  // Makes the written chunks visible. Errors: FAILED_PRECONDITION when
  // already committed or aborted. Daemon trouble is a fail_open in the result.
  Result<StoreResult> Commit();
  // Drops the reservation. Idempotent.
  void Abort();
  // True while the slots may be written: reserved, and neither committed nor aborted.
  bool writable() const;
  // The arena mapping the slots lie in (to register it with a GPU runtime).
  std::shared_ptr<Arena> mapping() const;

  uint32_t already_stored_chunks = 0;  // cached before
  uint32_t being_written_chunks = 0;   // another client's reservation is writing them
  uint32_t dropped_chunks = 0;         // no space
  Status fail_open;                    // non-OK when nothing could be reserved

 private:
  friend class Client;
  struct State;
  std::unique_ptr<State> state_;
};

class Client {
 public:
  // Connects to the daemon. A daemon that is down is not an error: the client
  // starts disconnected, fails open and keeps trying to reconnect. Errors:
  // INVALID_ARGUMENT for bad options (a deadline that is not positive, a socket
  // path too long for a Unix socket or that is not a socket, a client_name
  // over 256 bytes).
  static Result<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Validates `spec` and registers it with the daemon (again after each
  // reconnect). Errors: INVALID_ARGUMENT naming the bad field. A daemon that
  // is down is not an error.
  Result<NamespaceHandle> OpenNamespace(const NamespaceSpec& spec);

  // Keys of the full chunks of `tokens`, computed locally (no RPC).
  static std::vector<ChunkKey> ChunkKeys(const NamespaceHandle& ns,
                                         std::span<const int32_t> tokens);

  // `request_id` (Lookup, Prefetch, Load, Acquire): the engine's id of the
  // request the call serves (at most 256 bytes), the same on the scheduler's
  // and the workers' calls, so that the daemon's token hit rate counts the
  // request once and only what was leased (Stats). Optional: a call without
  // one counts as a request of its own; a Load with a ticket belongs to the
  // ticket's Prefetch. INVALID_ARGUMENT when longer.

  // How many leading tokens of `tokens` are cached (full chunks only).
  Result<LookupResult> Lookup(const NamespaceHandle& ns, std::span<const int32_t> tokens,
                              std::string_view request_id = {});

  // Prefetch on enqueue: call when a request is queued. The daemon starts
  // promoting the NVMe chunks of the cached prefix into DRAM and holds the
  // prefix until the Load that is given the ticket, or options.deadline.
  // Errors: INVALID_ARGUMENT for bad options or a namespace not opened here.
  Result<PrefetchTicket> Prefetch(const NamespaceHandle& ns, std::span<const int32_t> tokens,
                                  const PrefetchOptions& options = {},
                                  std::string_view request_id = {});
  // How far a prefetch got (one RPC).
  PrefetchProgress PrefetchStatus(const PrefetchTicket& ticket);

  // Loads the cached prefix of `tokens`: leases it, copies chunk i's payload to
  // destination[i * payload_bytes, (i + 1) * payload_bytes), then releases.
  // Loads at most destination.size() / payload_bytes chunks. Only the first
  // LoadResult::num_chunks chunks of `destination` are valid.
  // With `ticket` (from Prefetch of the same tokens), Load first waits as its
  // policy says, then takes over what it made ready without reading NVMe.
  Result<LoadResult> Load(const NamespaceHandle& ns, std::span<const int32_t> tokens,
                          std::span<std::byte> destination, const PrefetchTicket* ticket = nullptr,
                          std::string_view request_id = {});
  // The same without a staging buffer: calls `reader` for each leased chunk,
  // in order, on its bytes in the shared arena, then releases. At most
  // `max_chunks`. Chunks at index >= LoadResult::num_chunks turned out invalid
  // after the read (their lease lapsed and the slot was reused): the caller
  // must discard what it took from them.
  Result<LoadResult> Load(const NamespaceHandle& ns, std::span<const int32_t> tokens,
                          const ChunkReader& reader, size_t max_chunks = SIZE_MAX,
                          const PrefetchTicket* ticket = nullptr, std::string_view request_id = {});

  // Leases the cached prefix of `tokens` (at most `max_chunks` chunks) and
  // keeps it until the lease is released: Load without the copy. With
  // `ticket`, as Load. Errors: INVALID_ARGUMENT for a namespace not opened here.
  // With `hbm` (a GPU reader that can open the HBM pool), the lease also
  // holds the HBM copies of the chunks that have one, and the daemon copies
  // the other hit chunks into HBM in the background for later loads.
  // A `ticket` of another session (its session_id is not this client's: an
  // engine's scheduler prefetched in its own process) is taken over when
  // `request_id` is the Prefetch's; it is not waited for, and one that is gone
  // leaves NVMe and the remote tier read as without a ticket.
  // `first_chunk`: the caller holds chunks [0, first_chunk) already (an
  // engine's own prefix cache) and reads only the ones after; they are leased
  // too (the lease starts at chunk 0) but the daemon counts them neither as
  // hits nor as bytes read.
  Result<ChunkLease> Acquire(const NamespaceHandle& ns, std::span<const int32_t> tokens,
                             size_t max_chunks = SIZE_MAX, const PrefetchTicket* ticket = nullptr,
                             bool hbm = false, std::string_view request_id = {},
                             size_t first_chunk = 0);
  // Reserves slots for the full chunks of `tokens` from `first_chunk` on that
  // are not cached: Store without the writes.
  Result<ChunkReservation> Reserve(const NamespaceHandle& ns, std::span<const int32_t> tokens,
                                   size_t first_chunk = 0);

  // Stores the full chunks of `tokens` from index `first_chunk` on (chunks
  // before it are known to be cached): reserves slots, calls `writer` for each
  // chunk not yet stored, straight into the arena, then commits.
  Result<StoreResult> Store(const NamespaceHandle& ns, std::span<const int32_t> tokens,
                            const ChunkWriter& writer, size_t first_chunk = 0);
  // The same from a contiguous source of [num_full_chunks][payload_bytes].
  // Errors: INVALID_ARGUMENT when `source` is shorter than that.
  Result<StoreResult> Store(const NamespaceHandle& ns, std::span<const int32_t> tokens,
                            std::span<const std::byte> source, size_t first_chunk = 0);

  // The daemon's HBM pool, as its session announced it (connecting first when
  // needed); nullopt when it has none or is unreachable.
  std::optional<HbmPoolInfo> HbmPool();

  // True while a session with the daemon is open.
  bool connected() const;
  // Ends the session (the daemon frees this client's leases and
  // reservations). Call it once this client's storers have finished: it tells
  // the daemon that nothing of it writes into its reservations any more, so
  // their slots are reused at once (a session that ends otherwise while its
  // process runs keeps them out of use until the process exits). Waits for the
  // daemon's acknowledgement up to the call deadline. Idempotent.
  void Close();

 private:
  class Impl;
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier
