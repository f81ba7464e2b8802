#include "kvtier/proto/convert.h"

namespace kvtier {

v1::NamespaceSpec ToProto(const NamespaceSpec& s) {
  v1::NamespaceSpec p;
  p.set_model_id(s.model_id);
  p.set_lora_id(s.lora_id);
  p.set_kv_dtype(s.kv_dtype);
  p.set_layout(s.layout);
  p.set_num_layers(s.num_layers);
  p.set_num_kv_heads(s.num_kv_heads);
  p.set_head_dim(s.head_dim);
  p.set_latent_dim(s.latent_dim);
  p.set_chunk_tokens(s.chunk_tokens);
  p.set_tp_rank(s.tp_rank);
  p.set_tp_size(s.tp_size);
  p.set_cache_salt(s.cache_salt);
  p.set_engine_keyed(s.engine_keyed);
  return p;
}

NamespaceSpec FromProto(const v1::NamespaceSpec& p) {
  NamespaceSpec s;
  s.model_id = p.model_id();
  s.lora_id = p.lora_id();
  s.kv_dtype = p.kv_dtype();
  s.layout = p.layout();
  s.num_layers = p.num_layers();
  s.num_kv_heads = p.num_kv_heads();
  s.head_dim = p.head_dim();
  s.latent_dim = p.latent_dim();
  s.chunk_tokens = p.chunk_tokens();
  s.tp_rank = p.tp_rank();
  s.tp_size = p.tp_size();
  s.cache_salt = p.cache_salt();
  s.engine_keyed = p.engine_keyed();
  return s;
}

}  // namespace kvtier
