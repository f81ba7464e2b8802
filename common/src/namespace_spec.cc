#include "kvtier/namespace_spec.h"

#include <cstdio>

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t for streaming hashes
#include <xxhash.h>

#include "kvtier/utf8.h"

namespace kvtier {
namespace {

constexpr size_t kMaxStringBytes = 512;

Status CheckText(const std::string& value, const char* field, bool required) {
  if (required && value.empty()) return Status::InvalidArgument(std::string(field) + " is empty");
  if (value.size() > kMaxStringBytes) {
    return Status::InvalidArgument(std::string(field) + " is longer than 512 bytes");
  }
  if (value.find('|') != std::string::npos) {
    return Status::InvalidArgument(std::string(field) + " must not contain '|'");
  }
  if (const size_t bad = FirstNonUtf8Byte(value); bad != value.size()) {
    return Status::InvalidArgument(std::string(field) + " is not UTF-8 (byte " +
                                   std::to_string(bad) + ")");
  }
  if (std::string control = ControlCharacterIn(value); !control.empty()) {
    return Status::InvalidArgument(std::string(field) + control);
  }
  return Status::Ok();
}

}  // namespace

uint32_t KvDtypeBytes(const std::string& dtype) {
  if (dtype == "fp16" || dtype == "bf16") return 2;
  if (dtype == "fp32") return 4;
  if (dtype == "fp8_e4m3" || dtype == "fp8_e5m2" || dtype == "int8") return 1;
  return 0;
}

Status NamespaceSpec::Validate() const {
  KVTIER_RETURN_IF_ERROR(CheckText(model_id, "model_id", true));
  KVTIER_RETURN_IF_ERROR(CheckText(lora_id, "lora_id", false));
  KVTIER_RETURN_IF_ERROR(CheckText(cache_salt, "cache_salt", false));
  if (KvDtypeBytes(kv_dtype) == 0) {
    return Status::InvalidArgument("kv_dtype '" + kv_dtype +
                                   "' is unknown (fp16, bf16, fp32, fp8_e4m3, fp8_e5m2, int8)");
  }
  if (num_layers < 1 || num_layers > 4096) {
    return Status::InvalidArgument("num_layers " + std::to_string(num_layers) +
                                   " is outside 1..4096");
  }
  if (chunk_tokens < 1 || chunk_tokens > 65536) {
    return Status::InvalidArgument("chunk_tokens " + std::to_string(chunk_tokens) +
                                   " is outside 1..65536");
  }
  if (tp_size < 1 || tp_size > 1024) {
    return Status::InvalidArgument("tp_size " + std::to_string(tp_size) + " is outside 1..1024");
  }
  if (tp_rank >= tp_size) {
    return Status::InvalidArgument("tp_rank " + std::to_string(tp_rank) + " is not below tp_size " +
                                   std::to_string(tp_size));
  }
  if (layout == "mha") {
    if (num_kv_heads < 1 || num_kv_heads > 1024) {
      return Status::InvalidArgument("num_kv_heads " + std::to_string(num_kv_heads) +
                                     " is outside 1..1024 for layout mha");
    }
    if (head_dim < 1 || head_dim > 4096) {
      return Status::InvalidArgument("head_dim " + std::to_string(head_dim) +
                                     " is outside 1..4096 for layout mha");
    }
    if (latent_dim != 0) return Status::InvalidArgument("latent_dim must be 0 for layout mha");
  } else if (layout == "mla") {
    if (latent_dim < 1 || latent_dim > 65536) {
      return Status::InvalidArgument("latent_dim " + std::to_string(latent_dim) +
                                     " is outside 1..65536 for layout mla");
    }
    if (num_kv_heads != 0 || head_dim != 0) {
      return Status::InvalidArgument("num_kv_heads and head_dim must be 0 for layout mla");
    }
    if (tp_rank != 0 || tp_size != 1) {
      return Status::InvalidArgument("layout mla is stored as tp_rank 0 of tp_size 1");
    }
  } else {
    return Status::InvalidArgument("layout '" + layout + "' is unknown (mha, mla)");
  }
  if (engine_keyed && uint64_t{chunk_tokens} * 4 < kEngineHashBytes) {
    return Status::InvalidArgument("chunk_tokens " + std::to_string(chunk_tokens) +
                                   " is below 8: an engine-keyed chunk carries a 32-byte hash "
                                   "in its token ids");
  }
  if (PayloadBytes() > kMaxPayloadBytes) {
    return Status::InvalidArgument("chunk payload of " + std::to_string(PayloadBytes()) +
                                   " bytes exceeds 1 GiB (lower chunk_tokens)");
  }
  return Status::Ok();
}

std::string NamespaceSpec::CanonicalString() const {
  return "kvtier/v1|model=" + model_id + "|lora=" + lora_id + "|dtype=" + kv_dtype +
         "|layout=" + layout + "|layers=" + std::to_string(num_layers) +
         "|kv_heads=" + std::to_string(num_kv_heads) + "|head_dim=" + std::to_string(head_dim) +
         "|latent_dim=" + std::to_string(latent_dim) +
         "|chunk_tokens=" + std::to_string(chunk_tokens) + "|tp_rank=" + std::to_string(tp_rank) +
         "|tp_size=" + std::to_string(tp_size) + "|salt=" + cache_salt +
         (engine_keyed ? "|keys=engine" : "");
}

std::string NamespaceSpec::RedactedString() const {
  if (cache_salt.empty()) return CanonicalString();
  NamespaceSpec shown = *this;
  shown.cache_salt = "(set)";
  return shown.CanonicalString();
}

NamespaceId NamespaceSpec::Digest() const {
  const std::string s = CanonicalString();
  XXH128_hash_t h = XXH3_128bits(s.data(), s.size());
  return NamespaceId{h.low64, h.high64};
}

uint64_t NamespaceSpec::BytesPerToken() const {
  const uint64_t elem = KvDtypeBytes(kv_dtype);
  if (layout == "mla") return uint64_t{num_layers} * latent_dim * elem;
  return uint64_t{2} * num_layers * num_kv_heads * head_dim * elem;
}

std::vector<ChunkKey> NamespaceSpec::ChunkKeys(const NamespaceId& ns,
                                               std::span<const int32_t> tokens) const {
  if (!engine_keyed) return ComputeChunkKeys(ns, tokens, chunk_tokens);
  std::vector<ChunkKey> keys;
  keys.reserve(tokens.size() / chunk_tokens);
  for (size_t i = 0; i + chunk_tokens <= tokens.size(); i += chunk_tokens) {
    keys.push_back(ComputeChunkKey(ns, tokens.subspan(i, chunk_tokens)));  // every parent: ns
  }
  return keys;
}

ChunkKey NamespaceSpec::ChunkParent(const NamespaceId& ns, std::span<const ChunkKey> keys,
                                    size_t i) const {
  return i == 0 || engine_keyed ? ns : keys[i - 1];
}

ChunkKey NamespaceSpec::ChunkKeyOf(const ChunkKey& parent, std::span<const int32_t> tokens) const {
  return ComputeChunkKey(parent, tokens);
}

}  // namespace kvtier
