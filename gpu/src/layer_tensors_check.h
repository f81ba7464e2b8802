// Validation shared by LayerwiseLoad and LayerwiseStore. Private to gpu/.
#pragma once

#include <string>
#include <vector>

#include "kvtier/gpu/kv_copy.h"
#include "kvtier/gpu/kv_transfer.h"

namespace kvtier::gpu::internal {

// kInvalidArgument unless there is one LayerTensors per layer with every tensor the
// layout needs set.
inline GpuStatus CheckLayerTensors(const KvChunkSet& chunks,
                                   const std::vector<LayerTensors>& layers, const char* who) {
  if (chunks.layout == nullptr)
    return GpuStatus::InvalidArgument(std::string(who) + ": layout is null");
  if (static_cast<int64_t>(layers.size()) != chunks.num_layers) {
    return GpuStatus::InvalidArgument(std::string(who) + ": " + std::to_string(layers.size()) +
                                      " layer tensors for " + std::to_string(chunks.num_layers) +
                                      " layers");
  }
  for (size_t i = 0; i < layers.size(); ++i) {
    for (int t = 0; t < chunks.layout->num_tensors(); ++t) {
      if (layers[i].tensors[t] == nullptr) {
        return GpuStatus::InvalidArgument(std::string(who) + ": tensor " + std::to_string(t) +
                                          " of layer " + std::to_string(i) + " is null");
      }
    }
  }
  return GpuStatus::Ok();
}

}  // namespace kvtier::gpu::internal
