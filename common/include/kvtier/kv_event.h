// KV events (DESIGN.md "KV event"): notices that a chunk became resident in,
// or left, a tier, in vLLM's KV-events schema (vllm/distributed/kv_events.py),
// so that a router built for vLLM's stream consumes kvtierd's unchanged.
//
// Wire form (what msgspec's msgpack encoder makes of vLLM's KVEventBatch):
//   batch = [ts (float64, Unix seconds), [event...], data_parallel_rank (int)]
//           (an array: EventBatch is array_like; kvtierd sends rank 0, as a
//           vLLM engine without data parallelism does)
//   event = a map tagged {"type": "<class name>", ...} (KVCacheEvent is a
//           tagged, non-array struct), with the fields in vLLM's order and
//           those at their default omitted:
//     BlockStored:  type, block_hashes, parent_block_hash, token_ids,
//                   block_size, lora_id, medium, lora_name
//     BlockRemoved: type, block_hashes, medium
//     AllBlocksCleared: type
//
// Block hashes are our 16-byte chunk keys as msgpack bin (ChunkKey::ToBytes:
// low64 then high64, each little-endian). vLLM's ExternalBlockHash is
// `bytes | int`; bytes is vLLM's default (its sha256 hashes) and keeps all 128
// bits, where the int form (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES) truncates to
// 64 bits and two chunks could then share a hash in a router's index.
// parent_block_hash is nil for a chunk whose parent is the namespace root
// (the first chunk of a prompt, and every chunk of an engine-keyed namespace).
// token_ids are the chunk's chunk_tokens ids; empty where the tokens are not
// known (engine-keyed namespaces keep the engine's hash there, not tokens),
// as vLLM sends for a block it has no token metadata for. block_size is the
// namespace's chunk_tokens; lora_id and lora_name are nil (the LoRA adapter
// is part of the namespace digest, hence of every key).
//
// Medium names are vLLM's own constants (MEDIUM_GPU, MEDIUM_CPU,
// MEDIUM_STORAGE): hbm is "GPU", dram is "CPU", nvme is "STORAGE".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/chunk_key.h"
#include "kvtier/status.h"

namespace kvtier {

enum class KvEventType : uint8_t { kBlockStored, kBlockRemoved, kAllBlocksCleared };
enum class KvMedium : uint8_t { kGpu, kCpu, kStorage };

// "BlockStored", "BlockRemoved", "AllBlocksCleared" (vLLM's class names, the tag).
std::string_view KvEventTypeName(KvEventType type);
// "GPU" (hbm), "CPU" (dram), "STORAGE" (nvme).
std::string_view KvMediumName(KvMedium medium);
// The inverse of KvMediumName; nullopt for another string.
std::optional<KvMedium> KvMediumFromName(std::string_view name);

struct KvEvent {
  KvEventType type = KvEventType::kBlockStored;
  KvMedium medium = KvMedium::kCpu;  // unused for kAllBlocksCleared
  // kvtierd sends one hash per event; a decoded event may carry several.
  std::vector<ChunkKey> block_hashes;
  // BlockStored only: nullopt is nil (the chunk's parent is the namespace root).
  std::optional<ChunkKey> parent;
  std::vector<int32_t> token_ids;  // BlockStored only; empty when not known
  uint32_t block_size = 0;         // BlockStored only: tokens per chunk
};

struct KvEventBatch {
  double ts = 0;  // Unix time in seconds when the batch was made
  std::vector<KvEvent> events;
  std::optional<int64_t> data_parallel_rank;  // nil/omitted: nullopt
};

// The msgpack bytes of `batch` (the wire form above; data_parallel_rank is
// omitted when nullopt, as msgspec omits a default).
std::string EncodeKvEventBatch(const KvEventBatch& batch);
// Parses the wire form. Accepts what vLLM's encoder makes with 16-byte bin
// hashes (an event's unknown fields are skipped). Errors: INVALID_ARGUMENT
// naming what is malformed (not msgpack, a hash that is not 16 bytes of bin,
// an unknown type tag or medium).
Result<KvEventBatch> DecodeKvEventBatch(std::string_view bytes);

// The ZMQ framing (ZmqEventPublisher): each batch is a multipart message
// [topic, sequence as 8-byte big-endian, payload]; the replay socket (ROUTER)
// takes [start sequence as 8 bytes big-endian] from a DEALER/REQ and answers
// each buffered batch from that sequence on as [topic, sequence, payload],
// then [empty, kKvEventReplayEnd, empty].
std::string KvEventSequenceBytes(uint64_t seq);
// nullopt unless `bytes` is 8 bytes.
std::optional<uint64_t> KvEventSequenceFrom(std::string_view bytes);
// -1 as a signed 8-byte big-endian integer (vLLM's END_SEQ).
inline constexpr uint64_t kKvEventReplayEnd = ~uint64_t{0};

}  // namespace kvtier
