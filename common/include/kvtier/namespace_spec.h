// NamespaceSpec: everything that makes KV bytes comparable (DESIGN.md "namespace").
//
// Two requests share KV only inside one namespace. The namespace digest
// (XXH3-128 of a canonical string) is the namespace id everywhere, on disk too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvtier/chunk_key.h"
#include "kvtier/status.h"

namespace kvtier {

// KV element types and their sizes in bytes.
//   "fp16", "bf16": 2 B; "fp32": 4 B; "fp8_e4m3", "fp8_e5m2", "int8": 1 B.
// Returns 0 for an unknown name.
uint32_t KvDtypeBytes(const std::string& dtype);

struct NamespaceSpec {
  // Engine model id, e.g. "meta-llama/Llama-3.1-8B". Required. Default: "".
  std::string model_id;
  // LoRA adapter id; empty for the base model. Default: "".
  std::string lora_id;
  // KV element type (see KvDtypeBytes). Default: "fp16".
  std::string kv_dtype = "fp16";
  // "mha" (K and V per KV head; also GQA/MQA) or "mla" (one latent vector per token).
  // Default: "mha".
  std::string layout = "mha";
  // Attention layers whose KV is stored. Range 1..4096. Default: 0 (must be set).
  uint32_t num_layers = 0;
  // KV heads on this TP rank (mha). Must be 0 for mla. Default: 0.
  uint32_t num_kv_heads = 0;
  // Head dimension in elements (mha). Must be 0 for mla. Default: 0.
  uint32_t head_dim = 0;
  // MLA latent dimension in elements (mla only; 0 for mha). Default: 0.
  uint32_t latent_dim = 0;
  // Tokens per chunk. Range 1..65536. Default: 256.
  uint32_t chunk_tokens = 256;
  // Tensor-parallel rank and size (rank 0 of 1 for mla). Default: 0 of 1.
  uint32_t tp_rank = 0;
  uint32_t tp_size = 1;
  // Tenant isolation salt set by the engine or gateway; empty for none. Default: "".
  std::string cache_salt;
  // Engine-keyed (DESIGN.md "engine-keyed namespace"): the engine names each chunk with its
  // own page hash (SGLang HiCache: SHA-256) instead of kvtier hashing token ids. A chunk's
  // chunk_tokens int32 "token ids" then carry that hash: its kEngineHashBytes bytes first
  // (little-endian words), zeros after; so chunk_tokens must be >= 8. Every chunk's parent is
  // the namespace digest (the engine's hash chains the prefix itself), so the chunk key is
  // XXH3-128(digest || the chunk's ids): the same page hash in two namespaces (two TP ranks)
  // names two chunks. The slot header keeps the whole hash, checked on every lookup and
  // read: a mismatch is a miss. Default: false.
  bool engine_keyed = false;

  // Checks every field; INVALID_ARGUMENT naming the first bad field.
  Status Validate() const;

  // The canonical string hashed into the digest:
  // kvtier/v1|model=M|lora=L|dtype=D|layout=Y|layers=N|kv_heads=H|head_dim=E|
  // latent_dim=A|chunk_tokens=C|tp_rank=R|tp_size=S|salt=T, followed by |keys=engine for
  // an engine-keyed namespace (so token-keyed digests are those of DESIGN.md).
  std::string CanonicalString() const;
  // CanonicalString() with the salt's value replaced by "(set)" when there is
  // one: what logs and displays show (the salt is a tenant's secret).
  std::string RedactedString() const;
  // XXH3-128 of CanonicalString(): the namespace id.
  NamespaceId Digest() const;

  // KV bytes of one token over all layers: mha 2*layers*heads*head_dim*elem,
  // mla layers*latent_dim*elem. REQUIRES: Validate() is OK.
  uint64_t BytesPerToken() const;
  // Bytes of one chunk payload: BytesPerToken() * chunk_tokens.
  uint64_t PayloadBytes() const { return BytesPerToken() * chunk_tokens; }
  // Bytes of one layer of one chunk payload (a contiguous range of the payload).
  uint64_t LayerBytes() const { return PayloadBytes() / num_layers; }

  // Keys of the full chunks of `tokens` in this namespace (digest `ns`): the chained
  // XXH3-128 of DESIGN.md "chunk key"; engine_keyed: each chunk hashed with parent `ns`.
  std::vector<ChunkKey> ChunkKeys(const NamespaceId& ns, std::span<const int32_t> tokens) const;
  // The parent of chunk i of a prompt with `keys`: keys[i - 1], or `ns` for chunk 0 and for
  // every chunk of an engine-keyed namespace.
  ChunkKey ChunkParent(const NamespaceId& ns, std::span<const ChunkKey> keys, size_t i) const;
  // The key a chunk with this parent and these chunk_tokens ids must have.
  ChunkKey ChunkKeyOf(const ChunkKey& parent, std::span<const int32_t> tokens) const;
};

// Bytes of an engine's page hash an engine-keyed chunk carries (SHA-256).
inline constexpr size_t kEngineHashBytes = 32;

// Largest chunk payload a namespace may have (1 GiB).
inline constexpr uint64_t kMaxPayloadBytes = uint64_t{1} << 30;

}  // namespace kvtier
