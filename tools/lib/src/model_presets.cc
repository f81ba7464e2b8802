#include "kvtier/tools/model_presets.h"

namespace kvtier::tools {

std::vector<std::string> ModelPresetNames() { return {"tiny", "qwen2.5-0.5b", "llama3-8b"}; }

Result<NamespaceSpec> ModelPreset(const std::string& name, uint32_t chunk_tokens) {
  NamespaceSpec s;
  s.model_id = name;
  s.kv_dtype = "fp16";
  s.layout = "mha";
  s.chunk_tokens = chunk_tokens;
  if (name == "tiny") {
    s.num_layers = 2, s.num_kv_heads = 1, s.head_dim = 64;
  } else if (name == "qwen2.5-0.5b") {
    s.model_id = "Qwen/Qwen2.5-0.5B", s.num_layers = 24, s.num_kv_heads = 2, s.head_dim = 64;
  } else if (name == "llama3-8b") {
    s.model_id = "meta-llama/Llama-3.1-8B", s.num_layers = 32, s.num_kv_heads = 8, s.head_dim = 128;
  } else {
    return Status::InvalidArgument("--model '" + name +
                                   "' is unknown (tiny, qwen2.5-0.5b, llama3-8b)");
  }
  KVTIER_RETURN_IF_ERROR(s.Validate());
  return s;
}

}  // namespace kvtier::tools
