// KvCopyParams: a KvLayerCopy resolved to byte strides and an access width, shared by the
// CUDA kernel (kv_copy_kernel.cu) and the host backend (host_kv_copy.cc) so both move the
// same bytes. Private to gpu/.
#pragma once

#include <cstdint>

#include "kvtier/gpu/gpu_status.h"
#include "kvtier/gpu/kv_copy.h"

namespace kvtier::gpu::internal {

struct KvCopyPlaneParams {
  int32_t tensor;              // Index into KvCopyParams::tensors.
  int64_t offset_bytes;        // Plane start within the tensor.
  int64_t block_stride_bytes;  // Between consecutive block ids.
  int64_t token_stride_bytes;  // Between tokens of one block.
  int64_t head_stride_bytes;   // Between heads of one token.
};

// Copy unit: `unit_bytes` bytes (1, 2, 4, 8 or 16), aligned to unit_bytes on both sides.
// A head row (head_dim elements, `row_bytes` in the payload) is `units_per_row` units,
// `unit_stride_bytes` apart in the cache (== unit_bytes when the row is contiguous there).
struct KvCopyParams {
  unsigned char* tensors[2];
  KvCopyPlaneParams planes[2];
  int32_t num_planes;
  int32_t heads;
  int32_t units_per_row;
  int32_t unit_bytes;
  int64_t unit_stride_bytes;
  int64_t row_bytes;
  int64_t chunk_tokens;
  int64_t block_size;
  int64_t blocks_per_chunk;
  int64_t num_chunks;
  const uint64_t* chunk_addrs;  // [num_chunks]; 0 = skip the chunk.
  uint64_t payload_offset_bytes;
  const int32_t* block_ids;  // [num_chunks][blocks_per_chunk]
  bool to_cache;
};

// Validates `copy` (see Runtime::LaunchKvCopy for the errors) and resolves it into *out,
// choosing the widest unit that the strides, row size and alignments allow.
GpuStatus BuildKvCopyParams(const KvLayerCopy& copy, KvCopyParams* out);

// Runs the copy on the calling thread (host backend).
void RunKvCopyOnHost(const KvCopyParams& params);

}  // namespace kvtier::gpu::internal
