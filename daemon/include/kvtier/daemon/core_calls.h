// The requests and answers of CacheCore's calls, with no protobuf in them.
//
// Each carries the fields of the wire message of the same name
// (proto/kvtier/v1/kvtier.proto says what each means); the gRPC services and
// the control ring translate (kvtier/daemon/core_wire.h). Byte fields of a
// request are views: the caller keeps them alive until the call returns (an
// asynchronous Lookup copies what it keeps before it returns). Token ids are
// packed little-endian int32, as on the wire, in storage aligned for int32 (a
// std::string's is); the core checks their length.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/chunk_key.h"
#include "kvtier/latency_histogram.h"
#include "kvtier/namespace_spec.h"

namespace kvtier::core {

// A chunk's place: in the DRAM arena, and in the HBM pool when it has a copy there.
struct ChunkLocation {
  uint64_t payload_offset = 0;  // bytes from the arena's start
  uint64_t payload_bytes = 0;
  uint64_t sequence = 0;            // the slot's sequence (Lookup); 0 for a reservation
  uint64_t hbm_payload_offset = 0;  // bytes from the HBM pool's start; 0 without a copy
  uint64_t hbm_sequence = 0;        // the HBM copy's own sequence; 0 without a copy
};

struct OpenNamespaceRequest {
  uint64_t session_id = 0;
  std::optional<NamespaceSpec> spec;  // missing: INVALID_ARGUMENT
};
struct OpenNamespaceResponse {
  NamespaceId namespace_id;
  uint64_t payload_bytes = 0;
  uint32_t header_bytes = 0;
  uint64_t slot_bytes = 0;
};

struct LookupRequest {
  uint64_t session_id = 0;
  uint64_t epoch = 0;
  std::string_view namespace_id;  // 16 bytes
  std::string_view tokens;        // the prompt, any length; only full chunks are keyed
  bool acquire = false;           // lease the hit chunks and return their locations
  uint32_t max_chunks = 0;        // 0: no limit
  uint64_t prefetch_ticket = 0;
  bool hbm = false;
  std::string_view request_id;
  uint32_t first_chunk = 0;   // the engine holds chunks [0, first_chunk): leased, never hits
  bool adopt_ticket = false;  // prefetch_ticket is another session's, of request_id
};
struct LookupResponse {
  uint32_t num_chunks = 0;            // the cached run of leading full chunks
  uint64_t cached_tokens = 0;         // num_chunks * chunk_tokens
  uint64_t lease_id = 0;              // 0 unless acquire and num_chunks > 0
  std::vector<ChunkLocation> chunks;  // with acquire: one per hit chunk, in order
  uint64_t lease_ttl_ms = 0;
  uint32_t nvme_chunks = 0;
  uint32_t prefetched_chunks = 0;
  uint32_t hbm_chunks = 0;
  uint32_t remote_chunks = 0;  // as LookupResponse.remote_chunks (kvtier.proto)
};

struct PrefetchRequest {
  uint64_t session_id = 0;
  uint64_t epoch = 0;
  std::string_view namespace_id;
  std::string_view tokens;
  uint64_t deadline_ms = 0;  // from now; 0 = 10,000; at most 600,000
  uint32_t max_chunks = 0;
  bool to_hbm = false;
  std::string_view request_id;
};
struct PrefetchResponse {
  uint64_t ticket = 0;  // 0 when nothing of the prompt is cached
  uint32_t total_chunks = 0;
  uint32_t nvme_chunks = 0;
  uint32_t ready_chunks = 0;
  uint64_t deadline_ms = 0;
  uint32_t remote_chunks = 0;
};
struct PrefetchStatusResponse {
  uint32_t ready_chunks = 0;
  uint32_t total_chunks = 0;
  bool done = false;
  uint32_t hbm_chunks = 0;
  bool hbm_done = false;
};

// The same numbers as the wire's ReserveOutcome.
enum class ReserveOutcome : int {
  kReserved = 1,
  kAlreadyStored = 2,
  kNoSpace = 3,
  kNoParent = 4,
  kKeyTaken = 5,
  kSessionLimit = 6,
  kNvmeBehind = 7,
  kBeingWritten = 8,
};
struct ChunkToWrite {
  std::string_view key;         // 16 bytes
  std::string_view parent_key;  // 16 bytes
  std::string_view tokens;      // chunk_tokens packed int32
};
struct ReserveWriteRequest {
  uint64_t session_id = 0;
  uint64_t epoch = 0;
  std::string_view namespace_id;
  std::vector<ChunkToWrite> chunks;  // consecutive chunks of one prompt, in order
};
struct ReserveWriteResponse {
  uint64_t reservation_id = 0;           // 0 when nothing was reserved
  std::vector<ReserveOutcome> outcomes;  // one per requested chunk
  std::vector<ChunkLocation> chunks;     // one per kReserved chunk, in request order
  uint64_t reservation_ttl_ms = 0;
};
struct CommitWriteResponse {
  uint32_t committed_chunks = 0;
  uint32_t dropped_chunks = 0;
};

struct EvictRequest {
  bool all = false;
  std::string_view namespace_id;  // 16 bytes
  std::string_view tokens;        // a prompt prefix of namespace_id
};
struct TierEviction {
  std::string tier;  // hbm, dram, nvme
  uint64_t removed = 0;
  uint64_t kept = 0;
};
struct EvictResponse {
  std::vector<TierEviction> tiers;
};

// kvtierctl ls: the chunks of a namespace, or of one prompt's prefix in it.
struct ListChunksRequest {
  std::string_view namespace_id;  // 16 bytes
  std::string_view tokens;        // empty: every chunk of the namespace
  uint32_t limit = 0;             // most chunks answered; 0: kMaxListedChunks
};
inline constexpr uint32_t kMaxListedChunks = 100000;
struct ChunkListing {
  ChunkKey key;
  bool in_hbm = false, in_dram = false, in_nvme = false;
  uint64_t payload_bytes = 0;     // 0 when the namespace is not open (its layout unknown)
  uint64_t slot_bytes = 0;        // the slot image: header, payload, padding to 4 KiB
  std::optional<uint64_t> age_s;  // since it came into DRAM (HBM for an HBM-only copy);
                                  // none for a chunk only on NVMe
  uint32_t hits = 0;              // DRAM hits while resident (saturating)
  bool pinned = false;            // a lease, a read, a copy or a write pins it
};
struct ListChunksResponse {
  std::vector<ChunkListing> chunks;
  uint64_t left_out = 0;  // chunks of the scope not answered (past limit)
};

struct TierStats {
  std::string name;  // hbm, dram, nvme, remote (its capacity and chunks: 0, not known here)
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;
  uint64_t capacity_chunks = 0;
  uint64_t chunks = 0;
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t evictions = 0;
  uint64_t read_bytes = 0;
  uint64_t write_bytes = 0;
  uint64_t pending_writes = 0;
  uint64_t corrupt_reads = 0;
  uint64_t io_errors = 0;
  bool degraded = false;
  uint64_t skipped_writes = 0;
  uint64_t lost_writes = 0;
  uint64_t pinned_chunks = 0;
  uint64_t uncommitted_bytes = 0;
  uint64_t throttled_writes = 0;
  // Of hits and read_bytes' leases, those whose Lookup answer never reached
  // the client (taken back: not in hits or read_bytes).
  uint64_t unserved_hits = 0;
  uint64_t unserved_read_bytes = 0;
};
// Tokens by the tier they were leased from.
struct TierTokens {
  uint64_t hbm = 0;
  uint64_t dram = 0;
  uint64_t nvme = 0;
  uint64_t remote = 0;
};
// One model's token counts (its namespaces' model_id), once per engine request.
struct ModelStats {
  std::string model_id;  // kOtherModels for the models past kMaxModelLabels
  uint64_t lookup_tokens = 0;
  TierTokens hit_tokens;           // served (as StatsResponse.hit_tokens)
  TierTokens unserved_hit_tokens;  // leased, answer lost (as StatsResponse.unserved_hit_tokens)
};
// Models counted apart (the rest share kOtherModels): a bound on Prometheus labels.
inline constexpr size_t kMaxModelLabels = 64;
inline constexpr const char* kOtherModels = "_other";
// How prefetch tickets ended.
struct PrefetchOutcomes {
  uint64_t nothing_cached = 0;  // no ticket: no leading chunk of the prompt in any tier
  uint64_t over_budget = 0;     // no ticket: the prefetch budget or session_max_bytes was spent
  uint64_t used = 0;            // a Lookup took the ticket over after its promotion finished
  uint64_t used_early = 0;      // ... before it finished (the chunks not yet read stay misses)
  uint64_t expired = 0;         // its deadline passed first
  uint64_t session_ended = 0;   // its session ended first
};
struct StatsResponse {
  std::vector<TierStats> tiers;
  uint64_t lookups = 0;
  uint64_t lookup_tokens = 0;
  uint64_t hit_tokens = 0;
  uint64_t sessions = 0;
  uint64_t active_leases = 0;
  uint64_t active_reservations = 0;
  uint64_t uptime_s = 0;
  uint64_t active_prefetches = 0;
  uint64_t prefetched_chunks = 0;
  uint64_t session_limited = 0;
  uint64_t ring_lookups = 0;
  uint64_t ring_calls = 0;
  uint64_t lookup_chunks = 0;        // full chunks of lookup_tokens
  uint64_t unserved_hit_tokens = 0;  // leased, then taken back: the answer never reached the client
  std::vector<ModelStats> models;    // in the order first seen
  PrefetchOutcomes prefetches;
};

// kvtierd's latency histograms (Prometheus kvtier_*_seconds), each as read now.
struct Latencies {
  LatencyHistogram::Snapshot lookup;      // a Lookup: request in to response out (with any
                                          // NVMe promotion it waits for)
  LatencyHistogram::Snapshot load;        // a read lease: granted to released (the client's copy)
  LatencyHistogram::Snapshot store;       // a write: reserved to committed (the client's copy)
  LatencyHistogram::Snapshot promotion;   // NVMe to DRAM: promotion started to finished
  LatencyHistogram::Snapshot nvme_read;   // one batch of NVMe reads (a promotion step)
  LatencyHistogram::Snapshot nvme_write;  // one batch of NVMe writes (the writer)
};

struct NamespaceInfo {
  NamespaceId namespace_id;
  NamespaceSpec spec;
  uint64_t chunks = 0;
  uint64_t slot_bytes = 0;
};

}  // namespace kvtier::core
