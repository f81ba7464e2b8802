// CacheCore: the daemon's request logic, with no gRPC in it.
//
// It validates every request (each rejected request gets INVALID_ARGUMENT or
// the fitting code with a message naming the field, and changes nothing), and
// owns sessions, namespaces, leases (read pins) and reservations (two-phase
// writes) over the DRAM tier. The gRPC services are thin adapters over it, and
// tests drive it with proto messages and a clock they advance.
//
// Thread-safety: thread-safe. One mutex (mu_) guards all state; payload
// checksums at commit are computed outside it (the reservation owns its slots).
#pragma once

#include <chrono>
#include <deque>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kvtier/clock.h"
#include "kvtier/namespace_spec.h"
#include "kvtier/slot_image.h"
#include "kvtier/status.h"
#include "kvtier/tiers/dram_tier.h"
#include "kvtier/tiers/nvme_tier.h"
#include "kvtier/v1/kvtier.pb.h"

namespace kvtier {

// When a committed DRAM chunk goes to NVMe.
enum class NvmeWritePolicy {
  kWriteThrough,  // every committed chunk, in the background
  kSelective,     // once it has been hit selective_min_hits times
};

// "write_through" or "selective"; INVALID_ARGUMENT otherwise (write_back is
// not implemented yet and says so).
Result<NvmeWritePolicy> ParseNvmeWritePolicy(const std::string& name);

struct CacheCoreOptions {
  // DRAM arena size in bytes, a multiple of 4 KiB. Default: 1 GiB.
  uint64_t dram_bytes = uint64_t{1} << 30;
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

  Status Validate() const;
};

class CacheCore {
 public:
  // `clock` must outlive the core. `epoch`: nonzero arena epoch.
  static Result<std::unique_ptr<CacheCore>> Create(const CacheCoreOptions& options,
                                                   uint64_t epoch, const Clock& clock);
  // The same with an NVMe tier built by the caller (tests wrap its devices to
  // inject faults); `options.nvme` is then ignored.
  static Result<std::unique_ptr<CacheCore>> Create(const CacheCoreOptions& options,
                                                   uint64_t epoch, const Clock& clock,
                                                   std::unique_ptr<NvmeTier> nvme);
  ~CacheCore();

  // Tiers whose I/O failed kNvmeDegradedAfter times in a row (until one
  // succeeds again): "nvme". DRAM keeps serving; NVMe misses are misses.
  std::vector<std::string> DegradedTiers() const;
  static constexpr uint32_t kNvmeDegradedAfter = 3;

  // Write-through to NVMe (when on): writes up to one batch of committed
  // chunks queued by CommitWrite and returns how many it took from the queue.
  // The daemon's NVMe worker calls it in a loop; tests call it directly.
  size_t WriteThroughOnce();
  bool nvme_enabled() const { return nvme_ != nullptr; }

  // Sessions: opened by the Session stream, ended when it breaks. Ending a
  // session ends its leases and frees its reservations at once.
  uint64_t OpenSession(const std::string& client_name, uint32_t pid);
  void EndSession(uint64_t session_id);

  // RPC bodies. Each returns the status the client sees; on error, `response`
  // is unspecified and no state changed.
  Status OpenNamespace(const v1::OpenNamespaceRequest& req, v1::OpenNamespaceResponse* resp);
  Status Lookup(const v1::LookupRequest& req, v1::LookupResponse* resp);
  Status ReleaseRead(const v1::ReleaseReadRequest& req);
  Status ReserveWrite(const v1::ReserveWriteRequest& req, v1::ReserveWriteResponse* resp);
  Status CommitWrite(const v1::CommitWriteRequest& req, v1::CommitWriteResponse* resp);
  Status AbortWrite(const v1::AbortWriteRequest& req);

  void Stats(v1::StatsResponse* resp);
  void Namespaces(v1::NamespacesResponse* resp);

  // Ends every lease and reservation whose TTL has passed on the clock. An
  // expired reservation can no longer be committed; its slots stay out of use
  // until its session ends, since a live writer may still be writing them.
  // Called periodically by the daemon; tests call it after advancing the clock.
  void ExpireNow();

  const Arena& arena() const { return dram_->arena(); }
  uint64_t epoch() const { return dram_->arena().epoch(); }
  const CacheCoreOptions& options() const { return options_; }

 private:
  struct NamespaceState {
    NamespaceSpec spec;
    NamespaceId id;
    SlotLayout layout;
    uint32_t ns_index = 0;  // DramTier's namespace number
    uint32_t active_reservations = 0;  // reservations holding a pointer to this state
  };
  struct Lease {
    uint64_t session_id = 0;
    Clock::TimePoint expiry;
    std::vector<uint32_t> handles;  // DramTier handles, pinned
  };
  struct ReservedChunk {
    ChunkKey key;
    ChunkKey parent;
    std::vector<int32_t> tokens;
    uint64_t slot_offset = 0;
  };
  struct Reservation {
    uint64_t session_id = 0;
    Clock::TimePoint expiry;
    NamespaceState* ns = nullptr;  // kept from reuse by active_reservations
    std::vector<ReservedChunk> chunks;
    // Resident chunks this write builds on (the first chunk's parent and the
    // request's already stored chunks), pinned until commit, abort or expiry
    // so that making room for the new chunks cannot evict them.
    std::vector<uint32_t> pinned;
  };
  struct Counters {
    uint64_t lookups = 0;
    uint64_t lookup_tokens = 0;
    uint64_t hit_tokens = 0;
    uint64_t hits = 0;
    uint64_t misses = 0;
    uint64_t read_bytes = 0;
    uint64_t write_bytes = 0;
    uint64_t token_check_failures = 0;
    uint64_t nvme_hits = 0;
    uint64_t nvme_read_bytes = 0;
    uint64_t nvme_write_bytes = 0;
    uint64_t nvme_io_errors = 0;
    uint32_t nvme_failure_streak = 0;  // consecutive failed NVMe batches
  };
  // REQUIRES: mu_ held.
  void NoteNvmeIo(bool ok);

  CacheCore(const CacheCoreOptions& options, std::unique_ptr<DramTier> dram, const Clock& clock)
      : options_(options), clock_(clock), dram_(std::move(dram)) {}

  // REQUIRES: mu_ held.
  Status CheckSession(uint64_t session_id) const;
  Status CheckEpoch(uint64_t epoch) const;
  Result<const NamespaceState*> FindNamespace(const std::string& namespace_id) const;
  void EndLease(std::unordered_map<uint64_t, Lease>::iterator it);
  // With `lock` held on entry and exit (dropped around the reads): reads the
  // NVMe chunks that continue `hits` into fresh DRAM slots, verifies and
  // indexes them, appends their handles. Returns how many were promoted.
  size_t PromoteFromNvme(std::unique_lock<std::mutex>& lock, const std::string& namespace_id,
                         const NamespaceState& snap, const std::vector<ChunkKey>& keys,
                         std::span<const int32_t> tokens, size_t limit,
                         std::vector<uint32_t>* hits);
  void FreeReservation(const Reservation& r);
  // The two halves of FreeReservation: drop its pins and in-flight keys; give
  // back its slots.
  void ReleaseReservationHolds(const Reservation& r);
  void FreeReservationSlots(const Reservation& r);

  const CacheCoreOptions options_;
  const Clock& clock_;

  mutable std::mutex mu_;
  std::unique_ptr<DramTier> dram_;                                    // GUARDED_BY(mu_)
  std::unique_ptr<NvmeTier> nvme_;  // thread-safe itself; lock order: mu_, then its own
  std::deque<ChunkKey> nvme_queue_;                                   // GUARDED_BY(mu_)
  uint64_t nvme_in_flight_ = 0;                                       // GUARDED_BY(mu_)
  std::vector<std::unique_ptr<NamespaceState>> namespaces_;           // GUARDED_BY(mu_)
  std::unordered_map<NamespaceId, NamespaceState*, ChunkKeyHash> ns_by_id_;  // GUARDED_BY(mu_)
  std::unordered_map<uint64_t, std::string> sessions_;                // GUARDED_BY(mu_)
  std::unordered_map<uint64_t, Lease> leases_;                        // GUARDED_BY(mu_)
  std::unordered_map<uint64_t, Reservation> reservations_;            // GUARDED_BY(mu_)
  // Reservations that expired while their session was alive: the writer may
  // still be copying into those slots, so they are reused only when the
  // session ends (session id -> reservations).
  std::unordered_map<uint64_t, std::vector<Reservation>> quarantined_;  // GUARDED_BY(mu_)
  std::unordered_set<ChunkKey, ChunkKeyHash> reserved_keys_;          // GUARDED_BY(mu_)
  uint64_t next_id_ = 1;                                              // GUARDED_BY(mu_)
  uint64_t next_sequence_ = 1;                                        // GUARDED_BY(mu_)
  Counters counters_;                                                 // GUARDED_BY(mu_)
  const Clock::TimePoint started_ = std::chrono::steady_clock::now();
};

}  // namespace kvtier
