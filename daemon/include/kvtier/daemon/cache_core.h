// CacheCore: the daemon's request logic, with no gRPC in it.
//
// It validates every request (each rejected request gets INVALID_ARGUMENT or
// the fitting code with a message naming the field, and changes nothing), and
// owns sessions, namespaces, leases (read pins) and reservations (two-phase
// writes) over the DRAM tier. The gRPC services and the control ring are thin
// adapters over it, and tests drive it with a clock they advance.
//
// Its parts, each with its own state:
// - leases and reservations: OwnedTable (owned_table.h), by id and by session;
// - the Promoter (promoter.h): NVMe reads into DRAM, for a Lookup with
//   acquire and for Prefetch tickets, on the core's I/O worker threads; a
//   Lookup that must promote completes through its callback once it is done;
// - the Destager (destager.h): write-through, selective and write-back to
//   NVMe, with NvmeHealth (nvme_health.h) its degraded state;
// - the HbmCopier (hbm_copier.h): copies into HBM (opt-in), a subset of DRAM.
//   A Lookup with `hbm` hands out the HBM copy of each chunk that has one
//   besides its DRAM location, leasing both, and queues its other hit chunks
//   for a copy; DRAM evicting a chunk drops its HBM copy.
//
// Thread-safety: thread-safe. One mutex (mu_) guards the DRAM tier and every
// part's bookkeeping; payload checksums at commit, NVMe I/O, write-through's
// staging copies and HBM copies run outside it (the reservation or the
// promotion owns its slots, a pin holds the source). Write-back copies each
// evicted image under it (DRAM's eviction listener runs there).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kvtier/clock.h"
#include "kvtier/daemon/core_calls.h"
#include "kvtier/daemon/core_namespace.h"
#include "kvtier/daemon/destager.h"
#include "kvtier/daemon/hbm_copier.h"
#include "kvtier/daemon/kv_event_publisher.h"
#include "kvtier/daemon/nvme_health.h"
#include "kvtier/daemon/owned_table.h"
#include "kvtier/daemon/promoter.h"
#include "kvtier/daemon/request_ledger.h"
#include "kvtier/logging.h"
#include "kvtier/namespace_spec.h"
#include "kvtier/slot_image.h"
#include "kvtier/status.h"
#include "kvtier/tiers/dram_tier.h"
#include "kvtier/tiers/hbm_tier.h"
#include "kvtier/tiers/nvme_tier.h"
#include "kvtier/tiers/remote_tier.h"

namespace kvtier {

struct CacheCoreOptions {
  // DRAM arena size in bytes, a multiple of 4 KiB. Default: 1 GiB.
  uint64_t dram_bytes = uint64_t{1} << 30;
  // Which chunk DRAM evicts when full. Default: leaf-first LRU.
  EvictionPolicyKind dram_eviction = EvictionPolicyKind::kLru;
  // A lease not released by then ends by itself. Default: 30 s.
  std::chrono::milliseconds lease_ttl{30000};
  // A reservation not committed by then is freed. Default: 30 s.
  std::chrono::milliseconds reservation_ttl{30000};
  // Longest prompt a Lookup accepts, in tokens. Default: 4,194,304 (16 MiB of ids).
  uint64_t max_prompt_tokens = uint64_t{1} << 22;
  // Most chunks in one ReserveWrite. Default: 65,536.
  uint32_t max_chunks_per_request = 65536;
  // NVMe tier: off when `nvme.paths` is empty (the default here; kvtierd's
  // flags --nvme-path/--nvme-bytes turn it on). Write policy: write-through.
  NvmeTierOptions nvme;
  // Default: write-through.
  NvmeWritePolicy nvme_write_policy = NvmeWritePolicy::kWriteThrough;
  // Hits that make a chunk go to NVMe under the selective policy. Range
  // 1..1,000,000. Default: 2.
  uint32_t selective_min_hits = 2;
  // Most namespaces the daemon keeps at once; when full, a namespace with no
  // resident chunk and no pending write makes room for a new one. Default: 1,024.
  uint32_t max_namespaces = 1024;
  // Threads that read NVMe for promotion and prefetch (each with its own
  // io_uring). Range 1..64. Default: 2.
  uint32_t nvme_workers = 2;
  // Write-back: most bytes of evicted images held in memory until the NVMe
  // writer takes them; past it an eviction is a skipped write. Default: 256 MiB.
  uint64_t write_back_buffer_bytes = uint64_t{256} << 20;
  // HBM tier: off when `hbm.bytes` is 0 (the default). Its copies run on the
  // I/O workers (nvme_workers of them).
  HbmTierOptions hbm;
  // Remote tier: off when `remote.url` is empty (the default). It needs the
  // NVMe tier: its writes go with the NVMe writer's batches (same policy).
  RemoteTierOptions remote;
  // Most DRAM slot bytes one session may hold at once: its leases, its prefetch
  // tickets and Lookup promotions, and its reservations (their slots and the
  // stored chunks they pin; expired ones until the session ends). Past it a
  // Lookup leases, and a Prefetch holds, a shorter prefix, and ReserveWrite
  // answers SESSION_LIMIT, so that one greedy or hung client cannot take every
  // slot from the others. A session holding nothing may always take one chunk.
  // 0: half of dram_bytes. Default: 0.
  uint64_t session_max_bytes = 0;
  // Write-through backpressure: while the chunks queued for the NVMe writer,
  // with the ReserveWrite's own, would fill more than half the DRAM arena, the
  // ReserveWrite waits up to this long for the writer, and past that drops its
  // chunks (NVME_BEHIND, counted in the nvme tier's throttled_writes) rather
  // than evict chunks whose write is still pending. 0 drops at once. Default:
  // 20 ms (well inside a client's 100 ms deadline).
  std::chrono::milliseconds write_through_wait{20};

  Status Validate() const;
  // session_max_bytes with its default applied.
  uint64_t SessionMaxBytes() const;
};

class CacheCore {
 public:
  // `clock` must outlive the core. `epoch`: nonzero arena epoch.
  static Result<std::unique_ptr<CacheCore>> Create(const CacheCoreOptions& options, uint64_t epoch,
                                                   const Clock& clock);
  // The same with an NVMe tier built by the caller (tests wrap its devices to
  // inject faults); `options.nvme` is then ignored.
  static Result<std::unique_ptr<CacheCore>> Create(const CacheCoreOptions& options, uint64_t epoch,
                                                   const Clock& clock,
                                                   std::unique_ptr<NvmeTier> nvme);
  // The same with the NVMe tier from `open_nvme` (nullptr: none), called once
  // the DRAM and HBM tiers exist, so that a missing GPU is found before slot
  // files are preallocated (kvtierd adds its hint to the NVMe errors there).
  using NvmeOpener = std::function<Result<std::unique_ptr<NvmeTier>>()>;
  static Result<std::unique_ptr<CacheCore>> Create(const CacheCoreOptions& options, uint64_t epoch,
                                                   const Clock& clock, const NvmeOpener& open_nvme);
  // The NVMe tier `options.nvme` names; nullptr when it is off (no paths).
  static Result<std::unique_ptr<NvmeTier>> OpenNvmeTier(const CacheCoreOptions& options);
  ~CacheCore();

  // Tiers whose I/O failed kNvmeDegradedAfter times in a row (until one
  // succeeds again), or whose index takes no more writes (a full disk, until
  // kvtierd restarts): "nvme". DRAM keeps serving; NVMe misses are misses.
  std::vector<std::string> DegradedTiers() const;
  static constexpr uint32_t kNvmeDegradedAfter = NvmeHealth::kDegradedAfter;

  // NVMe writes (when on): Destager::WriteOnce, up to one batch of chunks
  // queued by CommitWrite (or, under write-back, of images copied out at
  // eviction); returns how many it took. Tests call it directly. 0 without NVMe.
  size_t DestageOnce();
  // The same for up to `max_batches` batches, each batch's write beside the
  // next one's copy (Destager::WriteBatches), stopping early when
  // `keep_going` says no: what the daemon's NVMe worker calls in a loop.
  size_t DestageBatches(size_t max_batches, const std::function<bool()>& keep_going = {});
  static constexpr size_t kDestageBatchChunks = Destager::kBatchChunks;
  static constexpr uint64_t kDestageBatchBytes = Destager::kBatchBytes;
  // Write-back at a clean shutdown: writes every DRAM chunk not yet on NVMe
  // (stops early when the tier is degraded or `keep_going` says no, checked
  // between batches). Returns how many it queued.
  size_t FlushWriteBack(const std::function<bool()>& keep_going = [] { return true; });
  // NVMe writes queued or in flight (what stats call pending_writes).
  size_t PendingNvmeWrites() const;
  // Under write-back: DRAM chunks neither on NVMe nor queued for it (what a
  // shutdown has still to write besides PendingNvmeWrites); 0 under the other policies.
  size_t WriteBackDramOnly() const;
  bool nvme_enabled() const { return nvme_ != nullptr; }
  // The remote tier; nullptr when it is off. Set by Create and never changed.
  const RemoteTier* remote() const { return remote_.get(); }
  // NvmeTier::PersistAccessTimes (nothing without NVMe). The daemon calls it
  // about once a second so that NVMe's LRU order survives a restart.
  void PersistNvmeAccessTimes();
  // The HBM pool a client opens (for SessionOpened); nullptr when the tier is off.
  // Set by Create and never changed.
  const HbmTier* hbm() const { return hbm_.get(); }

  // Sessions: opened by the Session stream, ended when it breaks. Ending a
  // session ends its leases at once. Its open (and expired) reservations give
  // their keys back at once, but their slots only once the client process
  // `pid` has exited: a client whose stream broke while it lives (its
  // watchdog shut a socket that overran a deadline) may still be copying into
  // them. A pid of 0, one that is not running, or `writers_stopped` (the
  // client said so as it closed) frees them at once. Each session gets a
  // token of 128 random bits (32 hex digits) that its other calls must carry.
  uint64_t OpenSession(const std::string& client_name, uint32_t pid);
  void EndSession(uint64_t session_id, bool writers_stopped = false);
  // "" for an unknown session.
  std::string SessionToken(uint64_t session_id) const;
  // Whether `token` is session `session_id`'s (compared in constant time). An
  // unknown session is OK here: the call's own check reports it. Errors:
  // PERMISSION_DENIED for a missing or wrong token.
  Status CheckSessionToken(uint64_t session_id, std::string_view token) const;
  static constexpr size_t kMaxClientNameBytes = 256;
  // Counts a call that came over a control ring (StatsResponse.ring_calls),
  // and a Lookup that came over one and succeeded (ring_lookups, of lookups).
  void CountRingCall() { ring_calls_.fetch_add(1, std::memory_order_relaxed); }
  void CountRingLookup() { ring_lookups_.fetch_add(1, std::memory_order_relaxed); }

  // The calls (kvtier/daemon/core_calls.h holds their requests and answers;
  // kvtier/daemon/core_wire.h runs them with the wire's messages). Each
  // returns the status the client sees; on error, the response is unspecified
  // and no state changed.
  Status OpenNamespace(const core::OpenNamespaceRequest& req, core::OpenNamespaceResponse* resp);
  // Lookup completes through `done` (with `resp` filled), at once or, when it
  // promotes from NVMe, later on an I/O worker thread. `resp` must live until
  // then; `req`'s views only until Lookup returns. The second form waits for it.
  using Done = std::function<void(Status)>;
  void Lookup(const core::LookupRequest& req, core::LookupResponse* resp, Done done);
  Status Lookup(const core::LookupRequest& req, core::LookupResponse* resp);
  Status Prefetch(const core::PrefetchRequest& req, core::PrefetchResponse* resp);
  Status PrefetchStatus(uint64_t session_id, uint64_t ticket, core::PrefetchStatusResponse* resp);
  Status ReleaseRead(uint64_t session_id, uint64_t lease_id);
  // Ends a lease whose Lookup answer its client never got (it gave up first:
  // a cancelled RPC, a ring call given up), as ReleaseRead does, and takes
  // back the hits and bytes that Lookup counted: figures count only what was
  // served, and a retry of the request may count them again.
  Status ReleaseUnserved(uint64_t session_id, uint64_t lease_id);
  Status ReserveWrite(const core::ReserveWriteRequest& req, core::ReserveWriteResponse* resp);
  Status CommitWrite(uint64_t session_id, uint64_t reservation_id, core::CommitWriteResponse* resp);
  Status AbortWrite(uint64_t session_id, uint64_t reservation_id);

  // Admin eviction (the wire's EvictRequest says the scopes). Waits for NVMe
  // writes in flight; holds mu_ meanwhile only while it scans. Errors:
  // INVALID_ARGUMENT for a bad scope, NOT_FOUND for a prefix of a namespace
  // not open here, IO_ERROR when the NVMe index refuses (nothing removed).
  Status Evict(const core::EvictRequest& req, core::EvictResponse* resp);

  // Admin listing (kvtierctl ls): the chunks of a namespace in any tier (no
  // order; past req.limit, which ones are left out is arbitrary), or the
  // chunks of a prompt's prefix found in any tier, in prompt order. Holds mu_
  // while it scans. Errors: INVALID_ARGUMENT (namespace_id not 16 bytes, bad
  // tokens, fewer than one chunk of them, limit above kMaxListedChunks),
  // NOT_FOUND (no chunk of the namespace and it is not open; tokens of a
  // namespace not open here).
  Status ListChunks(const core::ListChunksRequest& req, core::ListChunksResponse* resp);

  core::StatsResponse Stats();
  // The latency histograms (Prometheus only; kvtierctl stats does not show them).
  core::Latencies ReadLatencies() const;
  std::vector<core::NamespaceInfo> Namespaces();

  // Ends every lease, reservation and prefetch whose TTL or deadline has passed on the clock. An
  // expired reservation can no longer be committed; its slots stay out of use
  // until its session ends, since a live writer may still be writing them.
  // Called periodically by the daemon; tests call it after advancing the clock.
  void ExpireNow();

  // KV events (kv_event_publisher.h): from this call on, every chunk that
  // becomes resident in a tier or leaves one is told to `sink`, first an
  // AllBlocksCleared (chunks already on NVMe at start are not told). nullptr
  // turns them off (the default). Call it before serving; `sink` must outlive
  // the core or be unset first. Defined in cache_core_events.cc.
  void SetKvEventSink(KvEventSink* sink);

  const Arena& arena() const { return dram_->arena(); }
  uint64_t epoch() const { return dram_->arena().epoch(); }
  const CacheCoreOptions& options() const { return options_; }

 private:
  using NamespaceState = CoreNamespace;
  // Chunks leased, by tier (hits: DRAM), and their tokens and payload bytes.
  struct Leased {
    uint64_t hit_tokens = 0, hits = 0, nvme_hits = 0, hbm_hits = 0, remote_hits = 0;
    uint64_t read_bytes = 0, hbm_read_bytes = 0;
    Leased& operator+=(const Leased& o);
  };
  // What a leasing Lookup added to the counters (CountRequest, GrantLookup):
  // counted as unserved when its client never got the answer (ReleaseUnserved).
  // The tier a leased chunk was counted for (LeaseCredit::tier).
  enum HitTier : uint8_t { kDramHit, kHbmHit, kNvmeHit, kRemoteHit };
  struct LeaseCredit : Leased {
    std::string request;         // its RequestLedger key
    RequestLedger::Range range;  // the chunks of the request it credited, and covers
    std::vector<uint8_t> tier;   // of each chunk in `range`: a Leased member (TierOf)
    uint32_t model = 0;          // its index in models_
    uint32_t chunk_tokens = 0;
    // The hits among chunks [from, to) of `range`, as counted (hit_tokens and
    // the tier counts; no bytes).
    Leased Hits(uint64_t from, uint64_t to) const;
  };
  struct Lease {
    LeaseCredit credit;
    uint64_t session_id = 0;
    uint64_t held_bytes = 0;  // counted against its session's session_max_bytes
    Clock::TimePoint expiry;
    std::chrono::steady_clock::time_point granted_at;  // for the load latency
    std::vector<uint32_t> handles;                     // DramTier handles, pinned
    std::vector<uint32_t>
        hbm_handles;  // HbmTier handles, pinned (their DRAM copies are in handles)
  };
  struct ReservedChunk {
    ChunkKey key;
    ChunkKey parent;
    std::vector<int32_t> tokens;
    uint64_t slot_offset = 0;
  };
  struct Reservation {
    uint64_t session_id = 0;
    uint64_t held_bytes = 0;  // as Lease's: its slots and pins
    Clock::TimePoint expiry;
    std::chrono::steady_clock::time_point reserved_at;  // for the store latency
    NamespaceState* ns = nullptr;                       // kept from reuse by active_reservations
    std::vector<ReservedChunk> chunks;
    // Resident chunks this write builds on (the first chunk's parent and the
    // request's already stored chunks), pinned until commit, abort or expiry
    // so that making room for the new chunks cannot evict them.
    std::vector<uint32_t> pinned;
  };
  using Promotion = Promoter::Promotion;
  struct Counters {
    uint64_t lookups = 0;
    // Once per engine request (RequestLedger): its prompt, and the chunks
    // leased from it by tier (hits: DRAM).
    uint64_t lookup_tokens = 0;
    uint64_t lookup_chunks = 0;
    // Every lease's credit, and of it that of leases whose client never got
    // the answer (so that both only grow: Prometheus counters).
    Leased leased, unserved;
    uint64_t write_bytes = 0;
    uint64_t token_check_failures = 0;
    uint64_t nvme_throttled_writes = 0;
    uint64_t session_limited = 0;  // calls cut short by session_max_bytes
    core::PrefetchOutcomes prefetches;
  };
  // Per model, by index (CoreNamespace::model): at most kMaxModelLabels + 1,
  // the last for the models past the bound.
  struct ModelCounters {
    std::string model_id;
    uint64_t lookup_tokens = 0;
    core::TierTokens hit_tokens, unserved_hit_tokens;  // every lease's, and the unserved ones'
  };
  // REQUIRES: mu_ held. The index in models_ of `model_id`, added if new.
  uint32_t ModelIndex(const std::string& model_id);
  // REQUIRES: mu_ held. Adds a lease's credit to one model's tokens by tier.
  static void AddTierTokens(core::TierTokens& to, const LeaseCredit& c);
  // REQUIRES: mu_ held. NvmeHealth::NoteIo (nothing without NVMe).
  void NoteNvmeIo(bool ok) {
    if (nvme_health_) nvme_health_->NoteIo(ok);
  }
  // REQUIRES: mu_ held. See DegradedTiers.
  bool NvmeDegraded() const { return nvme_health_ && nvme_health_->Degraded(); }

  CacheCore(const CacheCoreOptions& options, std::unique_ptr<DramTier> dram, const Clock& clock)
      : options_(options), clock_(clock), dram_(std::move(dram)) {}

  // REQUIRES: mu_ held.
  Status CheckSession(uint64_t session_id) const;
  Status CheckEpoch(uint64_t epoch) const;
  Result<const NamespaceState*> FindNamespace(std::string_view namespace_id) const;
  // Unpins a lease taken out of leases_ and gives its bytes back to its session.
  // `served`: false from ReleaseUnserved (its client never got the answer).
  void EndLease(const Lease& lease, bool served = true);
  // Validates the session, epoch and namespace of a Lookup or Prefetch and
  // returns a copy of the namespace. REQUIRES: mu_ not held.
  Result<NamespaceState> ResolveRequest(uint64_t session_id, uint64_t epoch,
                                        std::string_view namespace_id) const;
  // Whether DRAM chunk `h`, found under keys[i], holds chunk i of `tokens` in
  // its slot header (the token check every leased chunk passes); a failure is
  // counted and logged.
  bool TokenCheck(const NamespaceState& ns, const std::vector<ChunkKey>& keys,
                  std::span<const int32_t> tokens, size_t i, uint32_t h);
  // Whether DRAM chunk `h`, found under c.key, is chunk `c` of namespace `ns`
  // (namespace, parent and tokens in its header); a mismatch is counted and logged.
  bool ResidentIs(const NamespaceState& ns, uint32_t h, const ReservedChunk& c);
  // The DRAM-resident leading chunks of `keys` (at most `limit`), each checked
  // against its tokens in the slot header.
  std::vector<uint32_t> DramPrefix(const NamespaceState& ns, const std::vector<ChunkKey>& keys,
                                   std::span<const int32_t> tokens, size_t limit);
  // How many chunks from keys[from] on (below `limit`) are on NVMe or in
  // DRAM, in a row: what a promotion can make ready (it token-checks those in
  // DRAM). 0 without NVMe, or when keys[from] is in DRAM (it failed the check).
  size_t ContinuationRun(const std::vector<ChunkKey>& keys, size_t from, size_t limit) const;
  // How many chunks from keys[from] on (below `limit`) a promotion tries to
  // make ready: the ContinuationRun `run`, and with a remote tier (not
  // degraded) every chunk up to `limit`, since only a read finds what it holds.
  size_t PromotionReach(const std::vector<ChunkKey>& keys, size_t from, size_t limit,
                        size_t run) const;
  // REQUIRES: mu_ held. How many of keys[0, limit) are in DRAM or on NVMe, in
  // a row from the first (no token check: where a remote probe starts).
  size_t LocalRun(const std::vector<ChunkKey>& keys, size_t limit) const;
  // What a Lookup found, for its answer and the counters.
  struct LookupTally {
    std::chrono::steady_clock::time_point started;  // the Lookup came in
    uint64_t session_id = 0;
    bool acquire = false;
    bool hbm = false;  // the caller reads HBM: lease HBM copies, promote the other hits
    size_t prompt_tokens = 0;
    size_t num_keys = 0;     // full chunks of the prompt
    size_t max_hits = 0;     // min(num_keys, max_chunks)
    size_t first_chunk = 0;  // LookupRequest.first_chunk: the engine held the chunks before it
    size_t dram_hits = 0;
    size_t promoted_hits = 0;  // promoted by this Lookup: from NVMe, or from remote (remote_at)
    size_t prefetched = 0;
    std::string request;              // RequestLedger key
    std::vector<bool> prefetched_at;  // hit i was promoted from NVMe or remote by the ticket
    std::vector<bool> remote_at;      // hit i was read from the remote tier
  };
  // Marks in `t` the `hits` that a prefetch promoted into the slots it left them in:
  // ready[i] from i = dram_at_start on, from the remote tier where from_remote[i]. They are
  // NVMe or remote hits, not DRAM ones.
  static void MarkPromoted(uint32_t dram_at_start, const std::vector<uint32_t>& ready,
                           const std::vector<bool>& from_remote, const std::vector<uint32_t>& hits,
                           LookupTally* t);
  // REQUIRES: mu_ held. A Lookup without lease whose cached run (`hits`, then
  // `run` on NVMe) ends before tally.max_hits, with a remote tier not degraded:
  // queues an I/O worker to ask the remote tier which chunks past it it holds
  // (EXISTS, no read), which then answers the Lookup through `done`; true when
  // queued (`done` taken). The caller's thread never waits on the network.
  bool ProbeRemote(LookupTally& tally, const NamespaceState& ns, const std::vector<ChunkKey>& keys,
                   std::vector<uint32_t>& hits, size_t run, core::LookupResponse* resp, Done& done);
  // REQUIRES: mu_ held. Counts a Lookup in the token hit rate: the prompt at
  // the request's first sight, and the leased `hits` not yet credited to it.
  LeaseCredit CountRequest(const LookupTally& tally, const NamespaceState& ns,
                           const std::vector<uint32_t>& hits);
  // REQUIRES: mu_ held. Counts the prompt of `request` if it is new.
  void CountPrompt(const std::string& request, const NamespaceState& ns, size_t tokens,
                   size_t full_chunks);
  RequestLedger ledger_;  // GUARDED_BY(mu_)
  LatencyHistogram lookup_latency_, load_latency_, store_latency_;
  // Warnings a client or a bad disk can repeat at will, one per 10 s each.
  LogLimiter collision_log_;  // token checks and keys held by another chunk
  LogLimiter access_times_log_;
  // Answers a Lookup over `hits`; with acquire each is already pinned once,
  // and those pins become the lease's.
  void GrantLookup(const LookupTally& tally, const NamespaceState& ns,
                   const std::vector<uint32_t>& hits, core::LookupResponse* resp);
  void WorkerLoop();
  // REQUIRES: mu_ held. DRAM is about to evict `handle`: demote it under
  // write-back, and drop its HBM copy.
  void OnDramEviction(uint32_t handle);
  void StartWorkers();
  // Lets the workers finish every queued promotion (so every Lookup waiting
  // on one completes), then joins them.
  void StopWorkers();
  void FreeReservation(Reservation& r);
  // The two halves of FreeReservation: drop its pins and in-flight keys; give
  // back its slots.
  void ReleaseReservationHolds(Reservation& r);
  void FreeReservationSlots(const Reservation& r);

  const CacheCoreOptions options_;
  const Clock& clock_;

  mutable std::mutex mu_;
  // Before the parts below, which hold references to them (and so are
  // destroyed first).
  std::condition_variable work_cv_;                          // wakes the I/O workers
  std::vector<std::unique_ptr<NamespaceState>> namespaces_;  // GUARDED_BY(mu_)
  std::unordered_map<NamespaceId, NamespaceState*, ChunkKeyHash> ns_by_id_;  // GUARDED_BY(mu_)
  std::unique_ptr<DramTier> dram_;                                           // GUARDED_BY(mu_)
  // After dram_: it unpins the arena when destroyed. Bookkeeping GUARDED_BY(mu_).
  std::unique_ptr<HbmTier> hbm_;
  std::unique_ptr<HbmCopier> hbm_copier_;  // with hbm_, after it
  std::unique_ptr<NvmeTier> nvme_;         // thread-safe itself; lock order: mu_, then its own
  std::unique_ptr<RemoteTier> remote_;     // thread-safe itself; no I/O on it under mu_
  // With nvme_ (both after it: they hold references to it). GUARDED_BY(mu_),
  // but for the writer's own locking (see Destager).
  std::unique_ptr<NvmeHealth> nvme_health_;
  std::unique_ptr<Destager> destager_;
  std::unique_ptr<Promoter> promoter_;  // after the tiers and hbm_copier_ it uses
  // Lookups without lease waiting for the remote tier's answer (ProbeRemote);
  // the I/O workers run them.
  std::deque<std::function<void()>> remote_probes_;  // GUARDED_BY(mu_)
  bool stopping_ = false;                            // GUARDED_BY(mu_)
  std::vector<std::thread> workers_;                 // joined by ~CacheCore, before any member goes
  struct SessionInfo {
    std::string name;         // client name (pid N), for the logs
    std::string token;        // 32 hex digits
    uint64_t held_bytes = 0;  // its leases', promotions' and reservations' held_bytes
    uint32_t pid = 0;         // the client's process, as its hello said
  };
  // Reservations of ended sessions whose client process still ran: their
  // slots wait for it to exit (a pidfd that becomes readable; -1: polled with
  // kill(pid, 0) where pidfd_open is missing).
  struct Orphans {
    int pidfd = -1;
    uint32_t pid = 0;
    std::vector<Reservation> reservations;
  };
  // REQUIRES: mu_ held. Frees the slots of orphans whose process has exited.
  void ReapOrphans();
  // REQUIRES: mu_ held. How many more slots of `slot_bytes` session
  // `session_id` may hold under session_max_bytes (at least 1 while it holds
  // nothing); `returning`: bytes the call gives back first (a ticket taken over).
  size_t SessionAllowance(uint64_t session_id, uint64_t slot_bytes, uint64_t returning = 0) const;
  // REQUIRES: mu_ held. Adds `bytes` to (or, Drop, takes them from) the held
  // bytes of session `session_id`, if it is still open.
  void Hold(uint64_t session_id, uint64_t bytes);
  void Drop(uint64_t session_id, uint64_t bytes);
  std::unordered_map<uint64_t, SessionInfo> sessions_;                          // GUARDED_BY(mu_)
  OwnedTable<Lease> leases_{"lease_id", "released, expired or never granted"};  // GUARDED_BY(mu_)
  OwnedTable<Reservation> reservations_{
      "reservation_id", "committed, aborted, expired or never granted"};  // GUARDED_BY(mu_)
  // Reservations that expired while their session was alive: the writer may
  // still be copying into those slots, so they are reused only when the
  // session ends (session id -> reservations).
  std::unordered_map<uint64_t, std::vector<Reservation>> quarantined_;  // GUARDED_BY(mu_)
  std::vector<Orphans> orphans_;                                        // GUARDED_BY(mu_)
  std::unordered_set<ChunkKey, ChunkKeyHash> reserved_keys_;            // GUARDED_BY(mu_)
  uint64_t next_id_ = 1;                                                // GUARDED_BY(mu_)
  // REQUIRES: mu_ held. Hands out n fresh slot sequences; returns the first.
  uint64_t TakeSequences(size_t n) {
    const uint64_t first = next_sequence_;
    next_sequence_ += n;
    return first;
  }
  uint64_t next_sequence_ = 1;                             // GUARDED_BY(mu_)
  Counters counters_;                                      // GUARDED_BY(mu_)
  std::vector<ModelCounters> models_;                      // GUARDED_BY(mu_)
  std::unordered_map<std::string, uint32_t> model_index_;  // GUARDED_BY(mu_)
  // KV events (cache_core_events.cc): the tiers' residency listeners.
  // REQUIRES: mu_ held (tier is dram_ or hbm_).
  void OnSlotResidency(const SlotTier& tier, KvMedium medium, uint32_t handle, bool resident);
  // Under NVMe's lock, with or without mu_.
  void OnNvmeResidency(const ChunkKey& key, const ChunkKey& parent, const NamespaceId& ns,
                       std::span<const std::byte> image);
  KvEventSink* events_ = nullptr;  // set before serving
  // Namespaces seen to be engine-keyed (their chunks carry no token ids), for
  // OnNvmeResidency, which cannot read namespaces_. A leaf lock.
  std::mutex engine_keyed_mu_;
  std::unordered_set<NamespaceId, ChunkKeyHash> engine_keyed_;  // GUARDED_BY(engine_keyed_mu_)
  std::atomic<uint64_t> ring_lookups_{0};
  std::atomic<uint64_t> ring_calls_{0};
  const Clock::TimePoint started_ = std::chrono::steady_clock::now();
};

}  // namespace kvtier
