#include "kvtier/gpu/engine/model_shape.h"

namespace kvtier::gpu::engine {

GpuStatus ModelShape::Preset(const std::string& name, ModelShape* out) {
  if (out == nullptr) return GpuStatus::InvalidArgument("ModelShape::Preset: null out");
  ModelShape s;
  s.name = name;
  if (name == "llama3-8b") {
    s.num_layers = 32, s.num_q_heads = 32, s.num_kv_heads = 8, s.head_dim = 128;
    s.hidden = 4096, s.intermediate = 14336, s.vocab = 128256;
  } else if (name == "tiny-engine") {
    s.num_layers = 4, s.num_q_heads = 4, s.num_kv_heads = 2, s.head_dim = 16;
    s.hidden = 64, s.intermediate = 128, s.vocab = 512;
  } else {
    return GpuStatus::InvalidArgument("--model '" + name + "' is unknown (llama3-8b, tiny-engine)");
  }
  *out = std::move(s);
  return GpuStatus::Ok();
}

double ModelShape::LayerGemmFlops(int64_t tokens) const {
  const double weights = static_cast<double>(hidden) * qkv_dim() +               // QKV
                         static_cast<double>(num_q_heads * head_dim) * hidden +  // O
                         static_cast<double>(hidden) * 2 * intermediate +        // gate, up
                         static_cast<double>(intermediate) * hidden;             // down
  return 2.0 * static_cast<double>(tokens) * weights;
}

double ModelShape::LmHeadFlops() const { return 2.0 * static_cast<double>(hidden) * vocab; }

std::vector<int32_t> MakePrompt(int64_t n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  uint64_t x = 0x2545F4914F6CDD1Dull;
  for (auto& v : t) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;  // xorshift64
    v = static_cast<int32_t>(x % 128000);
  }
  return t;
}

}  // namespace kvtier::gpu::engine
