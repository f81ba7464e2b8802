// A small model for the layerwise tests: 4 layers of vLLM flash-attn fp16 cache (block 4,
// 2 heads, head_dim 16), 3 chunks of 16 tokens in a registered host arena, and the
// expected bytes after a load or a store, from the CPU reference in kv_test_support.h.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "kv_test_support.h"
#include "kvtier/gpu/kv_transfer.h"
#include "kvtier/gpu/runtime.h"
#include "runtime_test_support.h"

namespace kvtier::gpu::testing {

struct LayerwiseRig {
  static constexpr int64_t kLayers = 4;
  static constexpr int64_t kChunks = 3;
  static constexpr int64_t kChunkTokens = 16;
  static constexpr int64_t kBlock = 4;
  static constexpr int64_t kBlocksPerChunk = kChunkTokens / kBlock;

  KvLayoutSpec spec;
  KvLayout layout;
  size_t layer_bytes = 0;
  size_t payload_bytes = 0;
  size_t span = 0;                    // Bytes of one layer's tensor.
  std::vector<DeviceBuffer> tensors;  // [layer]
  std::vector<LayerTensors> layers;
  std::unique_ptr<HostMemory> arena;
  PinnedRange pinned;
  std::vector<void*> payloads;
  std::vector<int32_t> block_ids;

  // Allocates everything; tensors hold zeros, payloads random bytes. Wrap in
  // ASSERT_NO_FATAL_FAILURE.
  void Init(Runtime& runtime, Stream& stream) {
    spec = KvLayoutSpec::VllmFlashAttn(kChunks * kBlocksPerChunk + 4, kBlock, 2, 16, 2);
    ASSERT_TRUE(KvLayout::Create(spec, &layout).ok());
    layer_bytes = layout.LayerPayloadBytes(kChunkTokens);
    payload_bytes = layer_bytes * kLayers;
    span = layout.tensor_span_bytes(0);
    block_ids = ShuffledBlockIds(layout.num_blocks(), kChunks * kBlocksPerChunk, 3);
    const std::vector<uint8_t> zeros(span, 0);
    tensors.resize(kLayers);
    layers.resize(kLayers);
    for (int64_t l = 0; l < kLayers; ++l) {
      KVTIER_ASSERT_GPU_OK(runtime.Allocate(span, &tensors[l]));
      layers[l].tensors[0] = tensors[l].data();
      KVTIER_ASSERT_GPU_OK(runtime.CopyAsync(tensors[l].data(), zeros.data(), span, stream));
    }
    KVTIER_ASSERT_GPU_OK(runtime.Synchronize(stream));
    arena = std::make_unique<HostMemory>(kChunks * payload_bytes);
    const std::vector<uint8_t> random = RandomBytes(arena->size(), 17);
    std::memcpy(arena->data(), random.data(), random.size());
    KVTIER_ASSERT_GPU_OK(runtime.RegisterHost(arena->data(), arena->size(), PinOptions(), &pinned));
    payloads.clear();
    for (int64_t c = 0; c < kChunks; ++c) payloads.push_back(arena->data() + c * payload_bytes);
  }

  KvChunkSet Chunks() const {
    return KvChunkSet{&layout, kLayers, kChunkTokens, &pinned, payloads, block_ids};
  }

  uint8_t* Slice(int64_t chunk, int64_t layer) const {
    return static_cast<uint8_t*>(payloads[chunk]) + layer * layer_bytes;
  }

  // Layer `layer`'s tensor after loading the chunks whose `loaded(c)` is true into `base`.
  template <typename Pred>
  std::vector<uint8_t> ExpectedTensor(int64_t layer, std::vector<uint8_t> base, Pred loaded) const {
    for (int64_t c = 0; c < kChunks; ++c) {
      if (!loaded(c)) continue;
      const uint8_t* slice = Slice(c, layer);
      ForEachElement(spec, kChunkTokens, &block_ids[c * kBlocksPerChunk],
                     [&](int64_t pay, int, int64_t off, uint32_t e) {
                       std::memcpy(&base[off], slice + pay, e);
                     });
    }
    return base;
  }

  // The layer slice of chunk `chunk` gathered from a tensor holding `tensor`.
  std::vector<uint8_t> ExpectedSlice(int64_t chunk, const std::vector<uint8_t>& tensor) const {
    std::vector<uint8_t> slice(layer_bytes);
    ForEachElement(spec, kChunkTokens, &block_ids[chunk * kBlocksPerChunk],
                   [&](int64_t pay, int, int64_t off, uint32_t e) {
                     std::memcpy(&slice[pay], &tensor[off], e);
                   });
    return slice;
  }

  void ReadTensor(Runtime& runtime, Stream& stream, const void* device,
                  std::vector<uint8_t>* out) const {
    out->assign(span, 0);
    KVTIER_ASSERT_GPU_OK(runtime.CopyAsync(out->data(), device, span, stream));
    KVTIER_ASSERT_GPU_OK(runtime.Synchronize(stream));
  }
};

}  // namespace kvtier::gpu::testing
