// AdminClient: the operator's view of a kvtierd (what kvtierctl prints).
//
// Unlike Client it does not fail open: an unreachable daemon is an error
// (UNAVAILABLE or DEADLINE_EXCEEDED), because the operator asked.
//
// Thread-safety: thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvtier/chunk_key.h"
#include "kvtier/namespace_spec.h"
#include "kvtier/status.h"

namespace kvtier {

struct TierStats {
  std::string name;  // "hbm", "dram" or "nvme"
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;       // slots in use (committed or reserved)
  uint64_t capacity_chunks = 0;  // capacity_bytes / the smallest slot size opened
  uint64_t chunks = 0;           // committed chunks resident
  uint64_t hits = 0;             // chunks hit by lookups
  uint64_t misses = 0;           // full chunks looked up and not hit
  uint64_t evictions = 0;
  uint64_t read_bytes = 0;      // payload bytes leased out to clients
  uint64_t write_bytes = 0;     // payload bytes committed (dram) or written (nvme)
  uint64_t pending_writes = 0;  // nvme: committed chunks queued for write-through
  uint64_t corrupt_reads = 0;   // nvme: images that failed verification (dropped)
  uint64_t io_errors = 0;       // nvme: failed read or write batches
  bool degraded = false;        // repeated I/O failures: the other tiers serve
  uint64_t skipped_writes = 0;  // nvme: evicted from DRAM before write-through reached them
  uint64_t lost_writes = 0;     // nvme: handed to the NVMe writer and not stored (failed
                                // batch, no room, parent gone)
  uint64_t pinned_chunks = 0;   // dram, hbm: chunks pinned by a lease, ticket, reservation or copy
  uint64_t uncommitted_bytes = 0;    // dram, hbm: slots in use holding no committed chunk (open
                                     // reservations, promotions); left when idle: leaked
  uint64_t throttled_writes = 0;     // nvme: chunks dropped at ReserveWrite because write-through
                                     // stayed over half the DRAM arena behind (NVME_BEHIND)
  uint64_t unserved_hits = 0;        // leased, but the Lookup's answer never reached its client
  uint64_t unserved_read_bytes = 0;  // (its deadline passed): not in hits or read_bytes
};

// Tokens by the tier they were leased from.
struct TierTokens {
  uint64_t hbm = 0;
  uint64_t dram = 0;
  uint64_t nvme = 0;
  uint64_t remote = 0;

  uint64_t total() const { return hbm + dram + nvme + remote; }
};

// One model's tokens (its namespaces' model_id), once per engine request. The
// daemon counts the first 64 models apart and the rest under "_other".
struct ModelStats {
  std::string model_id;
  uint64_t lookup_tokens = 0;
  TierTokens hit_tokens;           // served
  TierTokens unserved_hit_tokens;  // leased, answer lost
};

// How Prefetch calls ended, one outcome each.
struct PrefetchOutcomes {
  uint64_t nothing_cached = 0;  // no ticket: nothing of the prompt cached
  uint64_t over_budget = 0;     // no ticket: prefetch budget or session_max_bytes spent
  uint64_t used = 0;            // taken over by a Lookup after its promotion finished
  uint64_t used_early = 0;      // taken over before it finished
  uint64_t expired = 0;         // deadline passed first
  uint64_t session_ended = 0;   // session ended first
};

struct DaemonStats {
  std::vector<TierStats> tiers;
  uint64_t lookups = 0;
  uint64_t ring_lookups = 0;   // of lookups, those that came over a control ring
  uint64_t ring_calls = 0;     // calls of every kind that came over a control ring, run or not
  uint64_t lookup_tokens = 0;  // all prompt tokens looked up, partial tails included
  uint64_t hit_tokens = 0;
  uint64_t sessions = 0;
  uint64_t active_leases = 0;
  uint64_t active_reservations = 0;
  uint64_t uptime_s = 0;
  uint64_t active_prefetches = 0;  // prefetch tickets not yet taken over or expired
  uint64_t prefetched_chunks = 0;  // chunks prefetches promoted from NVMe into DRAM
  // Lookups, Prefetches and ReserveWrites cut short by the per-session limit
  // (kvtierd --session-max-bytes).
  uint64_t session_limited = 0;
  uint64_t lookup_chunks = 0;        // full chunks of lookup_tokens
  uint64_t unserved_hit_tokens = 0;  // leased, answer lost: not in hit_tokens
  std::vector<ModelStats> models;
  PrefetchOutcomes prefetches;
};

struct DaemonHealth {
  bool serving = false;
  std::string version;
  uint64_t epoch = 0;  // arena epoch; changes on every daemon start
  uint32_t pid = 0;
  std::vector<std::string> degraded_tiers;  // tiers failing their I/O
};

struct NamespaceInfo {
  NamespaceId id;
  NamespaceSpec spec;
  uint64_t chunks = 0;  // resident in DRAM
  uint64_t slot_bytes = 0;
};

// What an admin eviction takes, from every tier: everything, one namespace, or
// a prompt prefix of one namespace (the chunk holding the last full chunk of
// `tokens` and every chunk after it: all cached prompts beginning with them;
// the namespace must be open in the daemon).
struct EvictScope {
  bool all = false;
  std::optional<NamespaceId> ns;
  std::optional<std::vector<int32_t>> tokens;  // a prefix: at least one full chunk

  static EvictScope All() { return {true, std::nullopt, std::nullopt}; }
  static EvictScope Namespace(const NamespaceId& id) { return {false, id, std::nullopt}; }
  static EvictScope Prefix(const NamespaceId& id, std::vector<int32_t> prefix) {
    return {false, id, std::move(prefix)};
  }
};

// One tier's part of an eviction.
struct TierEviction {
  std::string tier;      // "hbm", "dram" or "nvme"
  uint64_t removed = 0;  // chunks dropped
  uint64_t kept = 0;  // selected but pinned (leased, read or copied), or a pinned chunk's ancestor
};

// One cached chunk, as kvtierctl ls lists it.
struct ChunkInfo {
  ChunkKey key;
  std::vector<std::string> tiers;  // "hbm", "dram", "nvme": where it is resident
  uint64_t payload_bytes = 0;      // 0 when its namespace is not open in the daemon
  uint64_t slot_bytes = 0;         // its slot image (header, payload, 4 KiB padding)
  std::optional<uint64_t> age_s;   // seconds since it came into DRAM; none when only on NVMe
  uint32_t hits = 0;               // DRAM hits while resident
  bool pinned = false;             // a lease, read, copy or write holds it now
};
struct ChunkList {
  std::vector<ChunkInfo> chunks;
  uint64_t left_out = 0;  // chunks of the scope past the limit
};

// One setting of the daemon as it runs.
struct DaemonSetting {
  std::string key, value;
  std::string source;  // "default", "flag", "config FILE:LINE: key" or "built-in"
};

class AdminClient {
 public:
  // Opens a channel to the daemon's socket (no RPC yet). `deadline` bounds
  // each call. Errors: INVALID_ARGUMENT for an empty path or a nonpositive
  // deadline.
  static Result<std::unique_ptr<AdminClient>> Connect(const std::string& socket_path,
                                                      std::chrono::milliseconds deadline);
  ~AdminClient();

  Result<DaemonStats> Stats();
  Result<DaemonHealth> Health();
  Result<std::vector<NamespaceInfo>> Namespaces();
  // Drops the scope's chunks now (the daemon logs the eviction). Errors:
  // INVALID_ARGUMENT (no scope or two, tokens with `all`, empty tokens or
  // fewer than one chunk), NOT_FOUND (a prefix of a namespace not open
  // there), INTERNAL (the NVMe index refused, e.g. a full disk: nothing was
  // evicted), and those of every call.
  Result<std::vector<TierEviction>> Evict(const EvictScope& scope);
  // The chunks of namespace `ns` (`tokens` empty), or of that prompt's prefix,
  // at most `limit` (0: the daemon's cap, 100,000). Errors: INVALID_ARGUMENT,
  // NOT_FOUND (an unknown namespace; tokens of a namespace not open there).
  Result<ChunkList> ListChunks(const NamespaceId& ns, const std::vector<int32_t>& tokens,
                               uint32_t limit);
  // The daemon's effective configuration, in its order.
  Result<std::vector<DaemonSetting>> Config();

 private:
  class Impl;
  explicit AdminClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier
