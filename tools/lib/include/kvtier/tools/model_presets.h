// Model shape presets used by kvtier-replay and kvtier-bench.
#pragma once

#include <string>
#include <vector>

#include "kvtier/namespace_spec.h"
#include "kvtier/status.h"

namespace kvtier::tools {

// "tiny": 2 layers, 1 KV head, head_dim 64, fp16 = 512 B/token.
// "qwen2.5-0.5b": 24 layers, 2 KV heads, head_dim 64, fp16 = 12 KiB/token.
// "llama3-8b": 32 layers, 8 KV heads, head_dim 128, fp16 = 128 KiB/token.
// Errors: INVALID_ARGUMENT naming the preset and listing the known ones.
Result<NamespaceSpec> ModelPreset(const std::string& name, uint32_t chunk_tokens);
std::vector<std::string> ModelPresetNames();

}  // namespace kvtier::tools
