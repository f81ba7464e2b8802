// NamespaceSpec::Validate (one row per bad field) and payload sizes of presets.
#include "kvtier/namespace_spec.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/status_printer.h"
#include "kvtier/units.h"

namespace kvtier {
namespace {

NamespaceSpec Mha(const std::string& model, uint32_t layers, uint32_t heads, uint32_t head_dim) {
  NamespaceSpec s;
  s.model_id = model;
  s.num_layers = layers;
  s.num_kv_heads = heads;
  s.head_dim = head_dim;
  return s;
}

NamespaceSpec Tiny() {
  NamespaceSpec s = Mha("test-model", 2, 1, 64);
  s.chunk_tokens = 4;
  return s;
}

NamespaceSpec DeepSeekMla() {
  NamespaceSpec s;
  s.model_id = "deepseek-ai/DeepSeek-V3";
  s.layout = "mla";
  s.num_layers = 61;
  s.latent_dim = 576;  // kv_lora_rank 512 + rope dim 64
  s.kv_dtype = "bf16";
  return s;
}

TEST(NamespaceSpec, ValidPresetsPass) {
  EXPECT_TRUE(Tiny().Validate().ok()) << Tiny().Validate().ToString();
  EXPECT_TRUE(Mha("meta-llama/Llama-3.1-8B", 32, 8, 128).Validate().ok());
  EXPECT_TRUE(DeepSeekMla().Validate().ok()) << DeepSeekMla().Validate().ToString();
}

struct BadField {
  const char* name;  // field the message must name
  void (*mutate)(NamespaceSpec&);
  bool mla = false;  // start from the MLA preset instead of the tiny MHA one
};

TEST(NamespaceSpec, ValidateRejectsEachBadFieldNamingIt) {
  const BadField rows[] = {
      {"model_id", [](NamespaceSpec& s) { s.model_id = ""; }},
      {"model_id", [](NamespaceSpec& s) { s.model_id = "a|b"; }},
      {"model_id", [](NamespaceSpec& s) { s.model_id = std::string(513, 'm'); }},
      {"lora_id", [](NamespaceSpec& s) { s.lora_id = "lora|x"; }},
      {"cache_salt", [](NamespaceSpec& s) { s.cache_salt = "salt|x"; }},
      {"cache_salt", [](NamespaceSpec& s) { s.cache_salt = std::string(600, 's'); }},
      {"model_id", [](NamespaceSpec& s) { s.model_id = "qwen\xff"; }},  // not UTF-8
      {"lora_id", [](NamespaceSpec& s) { s.lora_id = "\xc3"; }},
      {"cache_salt", [](NamespaceSpec& s) { s.cache_salt = "\xed\xa0\x80"; }},  // a surrogate
      // control characters (a NUL was accepted; a newline forged a log line)
      {"model_id", [](NamespaceSpec& s) { s.model_id = std::string("qwen\0x", 6); }},
      {"lora_id", [](NamespaceSpec& s) { s.lora_id = "a\nnamespace x opened"; }},
      {"cache_salt", [](NamespaceSpec& s) { s.cache_salt = "\x7f"; }},
      {"model_id",
       [](NamespaceSpec& s) {
         s.model_id =
             "a\xc2\x85"
             "b";
       }},  // U+0085, C1
      {"kv_dtype", [](NamespaceSpec& s) { s.kv_dtype = "fp64"; }},
      {"kv_dtype", [](NamespaceSpec& s) { s.kv_dtype = ""; }},
      {"layout", [](NamespaceSpec& s) { s.layout = "gqa"; }},
      {"num_layers", [](NamespaceSpec& s) { s.num_layers = 0; }},
      {"num_layers", [](NamespaceSpec& s) { s.num_layers = 4097; }},
      {"num_kv_heads", [](NamespaceSpec& s) { s.num_kv_heads = 0; }},
      {"num_kv_heads", [](NamespaceSpec& s) { s.num_kv_heads = 1025; }},
      {"head_dim", [](NamespaceSpec& s) { s.head_dim = 0; }},
      {"head_dim", [](NamespaceSpec& s) { s.head_dim = 4097; }},
      {"latent_dim", [](NamespaceSpec& s) { s.latent_dim = 512; }},
      {"chunk_tokens", [](NamespaceSpec& s) { s.chunk_tokens = 0; }},
      {"chunk_tokens", [](NamespaceSpec& s) { s.chunk_tokens = 65537; }},
      {"tp_size", [](NamespaceSpec& s) { s.tp_size = 0; }},
      {"tp_size", [](NamespaceSpec& s) { s.tp_size = 1025; }},
      {"tp_rank", [](NamespaceSpec& s) { s.tp_rank = 1; }},
      {"latent_dim", [](NamespaceSpec& s) { s.latent_dim = 0; }, true},
      {"num_kv_heads", [](NamespaceSpec& s) { s.num_kv_heads = 8; }, true},
      {"head_dim", [](NamespaceSpec& s) { s.head_dim = 128; }, true},
      {"tp_size", [](NamespaceSpec& s) { s.tp_size = 2; }, true},
      {"chunk_tokens",
       [](NamespaceSpec& s) {
         s.chunk_tokens = 65536;
         s.num_layers = 4096;
       }},
  };
  for (const BadField& r : rows) {
    NamespaceSpec s = r.mla ? DeepSeekMla() : Tiny();
    r.mutate(s);
    const Status st = s.Validate();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << r.name << ": " << st.ToString();
    EXPECT_NE(st.message().find(r.name), std::string::npos)
        << "message does not name " << r.name << ": " << st.message();
  }
}

TEST(NamespaceSpec, DtypeSizes) {
  EXPECT_EQ(KvDtypeBytes("fp16"), 2u);
  EXPECT_EQ(KvDtypeBytes("bf16"), 2u);
  EXPECT_EQ(KvDtypeBytes("fp32"), 4u);
  EXPECT_EQ(KvDtypeBytes("fp8_e4m3"), 1u);
  EXPECT_EQ(KvDtypeBytes("fp8_e5m2"), 1u);
  EXPECT_EQ(KvDtypeBytes("int8"), 1u);
  EXPECT_EQ(KvDtypeBytes("FP16"), 0u);
  EXPECT_EQ(KvDtypeBytes("fp4"), 0u);
}

TEST(NamespaceSpec, TinyPresetIs512BytesPerToken) {
  const NamespaceSpec s = Tiny();
  EXPECT_EQ(s.BytesPerToken(), 512u);  // 2 (K,V) * 2 layers * 1 head * 64 dim * 2 B
  EXPECT_EQ(s.PayloadBytes(), 2048u);
  EXPECT_EQ(s.LayerBytes(), 1024u);
}

TEST(NamespaceSpec, Qwen25HalfBPresetIs12KiBPerToken) {
  const NamespaceSpec s = Mha("Qwen/Qwen2.5-0.5B", 24, 2, 64);
  EXPECT_EQ(s.BytesPerToken(), 12 * kKiB);
  EXPECT_EQ(s.PayloadBytes(), 256 * 12 * kKiB);
  EXPECT_EQ(s.LayerBytes(), s.PayloadBytes() / 24);
}

TEST(NamespaceSpec, Llama3EightBPresetIs128KiBPerToken) {
  const NamespaceSpec s = Mha("meta-llama/Llama-3.1-8B", 32, 8, 128);
  EXPECT_EQ(s.BytesPerToken(), 128 * kKiB);
  EXPECT_EQ(s.PayloadBytes(), 32 * kMiB);  // 256 tokens
  EXPECT_EQ(s.LayerBytes(), kMiB);
}

TEST(NamespaceSpec, MlaPayloadIsLayersTimesLatentDim) {
  const NamespaceSpec s = DeepSeekMla();
  EXPECT_EQ(s.BytesPerToken(), 61u * 576 * 2);
  EXPECT_EQ(s.PayloadBytes(), 61u * 576 * 2 * 256);
  EXPECT_EQ(s.LayerBytes(), 576u * 2 * 256);
}

TEST(NamespaceSpec, Fp8HalvesThePayload) {
  NamespaceSpec s = Mha("m", 32, 8, 128);
  s.kv_dtype = "fp8_e4m3";
  EXPECT_EQ(s.BytesPerToken(), 64 * kKiB);
}

TEST(NamespaceSpec, PayloadOverOneGiBIsRejected) {
  NamespaceSpec s = Mha("m", 128, 64, 128);  // 4 MiB per token
  s.chunk_tokens = 256;                      // 1 GiB: the limit itself is fine
  EXPECT_TRUE(s.Validate().ok()) << s.Validate().ToString();
  s.chunk_tokens = 257;
  EXPECT_EQ(s.Validate().code(), StatusCode::kInvalidArgument);
}

TEST(NamespaceSpec, RedactedStringHidesTheSaltButNotThatThereIsOne) {
  NamespaceSpec s = Mha("m", 2, 2, 8);
  const std::string unsalted = s.CanonicalString();
  EXPECT_EQ(s.RedactedString(), unsalted);
  s.cache_salt = "tenant-secret-42";
  const NamespaceId salted = s.Digest();
  EXPECT_NE(s.CanonicalString().find("tenant-secret-42"), std::string::npos);
  EXPECT_EQ(s.RedactedString().find("tenant-secret-42"), std::string::npos) << s.RedactedString();
  EXPECT_NE(s.RedactedString().find("|salt=(set)"), std::string::npos) << s.RedactedString();
  EXPECT_EQ(s.cache_salt, "tenant-secret-42");  // the spec itself is unchanged
  EXPECT_EQ(s.Digest(), salted);
}

TEST(NamespaceSpec, EngineKeyedChunksAreKeyedByNamespaceAndEngineHashUnchained) {
  NamespaceSpec s = Mha("m", 2, 2, 8);
  s.chunk_tokens = 16;
  const std::string plain = s.CanonicalString();
  s.engine_keyed = true;
  ASSERT_TRUE(s.Validate().ok()) << s.Validate().ToString();
  EXPECT_EQ(s.CanonicalString(), plain + "|keys=engine");  // token-keyed digests unchanged
  // Two pages: ids 0..7 of each carry a 32-byte hash, the rest are zero.
  std::vector<int32_t> tokens(32, 0);
  for (int i = 0; i < 8; ++i) {
    tokens[i] = 0x01010101 * (i + 1);
    tokens[16 + i] = 0x10101010 + i;
  }
  const NamespaceId ns = s.Digest();
  const std::vector<ChunkKey> keys = s.ChunkKeys(ns, tokens);
  ASSERT_EQ(keys.size(), 2u);
  const std::span<const int32_t> all(tokens);
  EXPECT_EQ(keys[0], ComputeChunkKey(ns, all.subspan(0, 16)));
  EXPECT_EQ(keys[1], ComputeChunkKey(ns, all.subspan(16, 16)));  // parent ns, not keys[0]
  NamespaceSpec other = s;
  other.tp_rank = 1;
  other.tp_size = 2;  // another rank, the same page hashes: other chunks
  EXPECT_NE(other.ChunkKeys(other.Digest(), tokens)[0], keys[0]);
  EXPECT_EQ(s.ChunkParent(ns, keys, 1), ns);  // not chained: the engine's hash chains
  s.engine_keyed = false;
  EXPECT_EQ(s.ChunkParent(ns, keys, 1), keys[0]);
  EXPECT_EQ(s.ChunkKeys(ns, tokens), ComputeChunkKeys(ns, tokens, 16));

  s.engine_keyed = true;
  s.chunk_tokens = 7;  // 28 bytes cannot carry a 32-byte hash
  EXPECT_EQ(s.Validate().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier
