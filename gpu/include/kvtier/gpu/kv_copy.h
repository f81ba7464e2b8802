// The arguments of one gather/scatter launch between a layer of the paged KV cache and the
// chunk payloads (Runtime::LaunchKvCopy), and the copy-path choice of the pipelines above it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "kvtier/gpu/kv_layout.h"

namespace kvtier::gpu {

// How chunk bytes cross between pinned host memory and the paged cache.
enum class CopyPath : uint8_t {
  // One cudaMemcpyAsync per chunk and layer (the chunk's layer slice is contiguous) between
  // the host arena and a device staging buffer, plus a device gather/scatter kernel between
  // staging and the paged cache. The PCIe transfer runs on the copy engines, so it does not
  // take SMs from the engine's attention kernels while layer i+1 loads during layer i; the
  // kernel touches HBM only (tens of times faster than PCIe). Costs a staging buffer.
  kDma,
  // One SM kernel per layer reads/writes the pinned, device-mapped host arena directly
  // (zero-copy over PCIe). No staging and no per-copy launch cost, but it occupies SMs for
  // the whole PCIe transfer. Can win with tiny chunk slices or when HBM is scarce.
  kZeroCopy,
};

// Default: kDma, for the reason on kDma (overlap with compute without stealing SMs; the
// per-chunk copies are large, e.g. 256 tokens x 8 heads x 128 x 2 B x 2 = 1 MiB). On an H200
// (docs/BENCHMARKS.md) kZeroCopy copies faster alone but overlapped worse with attention.
inline constexpr CopyPath kDefaultCopyPath = CopyPath::kDma;

// "dma" or "zero_copy".
std::string_view CopyPathName(CopyPath path);

enum class KvCopyDirection : uint8_t {
  kPayloadToCache,  // Scatter: load chunks into the engine's blocks.
  kCacheToPayload,  // Gather: store the engine's blocks into chunk payloads.
};

// Device base addresses of one layer's cache tensor(s): [0] the tensor (SGLang: K), [1]
// SGLang's V tensor (else unused). Each must span layout.tensor_span_bytes(t).
struct LayerTensors {
  void* tensors[2] = {nullptr, nullptr};
};

// One layer of `num_chunks` chunks. Element (plane p, token t, head h, dim d) of chunk c's
// layer slice, at payload byte chunk_addrs[c] + payload_offset_bytes +
// (((p * chunk_tokens + t) * heads + h) * head_dim + d) * elem_bytes, is element (block
// block_ids[c * (chunk_tokens / block_size) + t / block_size], token t % block_size, h, d)
// of plane p of the layout. Direction says which side is written.
struct KvLayerCopy {
  // The layer's layout; borrowed for the call only. Required.
  const KvLayout* layout = nullptr;
  LayerTensors cache;
  // Tokens per chunk; a multiple of layout->block_size_tokens(). Required (> 0).
  int64_t chunk_tokens = 0;
  // Chunks in this launch. 0 queues nothing.
  int64_t num_chunks = 0;
  // Device-readable array (device memory) of num_chunks device-accessible addresses of
  // chunk payloads (device memory, or mapped pinned host memory for zero-copy). An entry
  // 0 skips that chunk. Read when the launch runs, not when it is queued.
  const uint64_t* chunk_addrs = nullptr;
  // Added to every chunk address: layer * layout->LayerPayloadBytes(chunk_tokens) for a
  // whole-chunk payload, 0 for a one-layer staging slot.
  uint64_t payload_offset_bytes = 0;
  // A power of two that divides every chunk_addrs[c] + payload_offset_bytes; lets the
  // copy move up to 16 bytes per access. 1 is always correct. Default: 1.
  size_t payload_align_bytes = 1;
  // Device-readable array (device memory) of num_chunks * (chunk_tokens / block_size)
  // block ids. REQUIRES: each in [0, layout->num_blocks()); not checked (device memory).
  const int32_t* block_ids = nullptr;
  KvCopyDirection direction = KvCopyDirection::kPayloadToCache;
};

}  // namespace kvtier::gpu
