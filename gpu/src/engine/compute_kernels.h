// Launchers of the compute kernels (compute_kernels.cu), callable from host C++ compiled by
// g++. Each returns the launch error (cudaSuccess if queued); errors of the kernel itself
// appear later on the stream. REQUIRES: every pointer is device memory of the stream's
// device, counts > 0.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "compute_params.h"

namespace kvtier::gpu::engine::internal {

// Writes K and V of p.num_tokens tokens into the paged cache (KvAppendArgs).
cudaError_t LaunchKvAppendKernel(const KvAppendParams& p, cudaStream_t stream);

// Copies K and V of positions [0, context) from the paged cache into contiguous
// [heads][context][head_dim] arrays k_out and v_out.
cudaError_t LaunchKvGatherKernel(const PagedKvParams& kv, int64_t context, uint16_t* k_out,
                                 uint16_t* v_out, cudaStream_t stream);

// Row r of `rows` rows of `scores` ([rows][row_len] fp32, row r of query tile row
// r % tile_rows) becomes probabilities in `probs` ([rows][row_len], fp16/bf16):
// softmax(scale * s) over entries [0, first_visible + (r % tile_rows) + 1), zeros after.
cudaError_t LaunchMaskedSoftmaxKernel(ScalarType type, const float* scores, uint16_t* probs,
                                      int64_t rows, int64_t tile_rows, int64_t row_len,
                                      int64_t first_visible, float scale, cudaStream_t stream);

}  // namespace kvtier::gpu::engine::internal
