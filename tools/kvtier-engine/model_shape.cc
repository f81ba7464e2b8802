#include "model_shape.h"

namespace kvtier::engine {

Result<ModelShape> ModelShape::Preset(const std::string& name) {
  ModelShape s;
  s.name = name;
  if (name == "llama3-8b") {
    s.num_layers = 32, s.num_q_heads = 32, s.num_kv_heads = 8, s.head_dim = 128;
    s.hidden = 4096, s.intermediate = 14336, s.vocab = 128256;
  } else if (name == "tiny-engine") {
    s.num_layers = 4, s.num_q_heads = 4, s.num_kv_heads = 2, s.head_dim = 16;
    s.hidden = 64, s.intermediate = 128, s.vocab = 512;
  } else {
    return Status::InvalidArgument("--model '" + name + "' is unknown (llama3-8b, tiny-engine)");
  }
  return s;
}

double ModelShape::LayerGemmFlops(int64_t tokens) const {
  const double weights = static_cast<double>(hidden) * qkv_dim() +               // QKV
                         static_cast<double>(num_q_heads * head_dim) * hidden +  // O
                         static_cast<double>(hidden) * 2 * intermediate +        // gate, up
                         static_cast<double>(intermediate) * hidden;             // down
  return 2.0 * static_cast<double>(tokens) * weights;
}

double ModelShape::LmHeadFlops() const { return 2.0 * static_cast<double>(hidden) * vocab; }

NamespaceSpec ModelShape::Namespace(uint32_t chunk_tokens, const std::string& cache_salt) const {
  NamespaceSpec ns;
  ns.model_id = "kvtier-engine/" + name;
  ns.kv_dtype = "fp16";
  ns.layout = "mha";
  ns.num_layers = static_cast<uint32_t>(num_layers);
  ns.num_kv_heads = static_cast<uint32_t>(num_kv_heads);
  ns.head_dim = static_cast<uint32_t>(head_dim);
  ns.chunk_tokens = chunk_tokens;
  ns.cache_salt = cache_salt;
  return ns;
}

}  // namespace kvtier::engine
