// ModelShape: the transformer shapes the test engine (kvtier/gpu/engine/engine.h) computes
// with.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvtier/gpu/gpu_status.h"

namespace kvtier::gpu::engine {

// A decoder-only transformer with grouped-query attention, one TP rank.
// Thread-safety: a value type.
struct ModelShape {
  std::string name;
  int64_t num_layers = 0;
  int64_t num_q_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t hidden = 0;        // = num_q_heads * head_dim for the presets
  int64_t intermediate = 0;  // MLP width (gate and up projections each)
  int64_t vocab = 0;         // LM head rows

  // Sets *out to a preset:
  // "llama3-8b": Llama 3.1 8B (config.json of meta-llama/Llama-3.1-8B): 32 layers, 32 query
  //   heads, 8 KV heads, head_dim 128, hidden 4096, intermediate 14336, vocab 128256.
  // "tiny-engine": 4 layers, 4 query heads, 2 KV heads, head_dim 16, hidden 64,
  //   intermediate 128, vocab 512 (host emulation, tests).
  // Errors: kInvalidArgument naming the known presets (*out unchanged).
  static GpuStatus Preset(const std::string& name, ModelShape* out);

  int64_t qkv_dim() const { return (num_q_heads + 2 * num_kv_heads) * head_dim; }

  // Bytes of one token's K and V in every layer (fp16): num_layers * 2 * kv_heads *
  // head_dim * 2.
  int64_t KvBytesPerToken() const { return num_layers * 2 * num_kv_heads * head_dim * 2; }

  // GEMM floating-point operations of one layer for `tokens` new tokens: QKV, O, gate+up and
  // down projections (2 * tokens * sum of weight sizes).
  double LayerGemmFlops(int64_t tokens) const;
  // The LM head for one token (the first output token's logits).
  double LmHeadFlops() const;
};

// `n` deterministic prompt tokens in [0, 128000) (a Llama 3 sized vocabulary),
// the same in kvtier-engine and kvtier-engine-standalone.
std::vector<int32_t> MakePrompt(int64_t n);

}  // namespace kvtier::gpu::engine
