// The CUDA backend of Compute: GEMMs and attention by cuBLAS (loaded with dlopen at the
// first use, cublas_loader.h), KV append, gather and softmax by compute_kernels.cu.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "compute_backend.h"
#include "compute_kernels.h"
#include "cublas_loader.h"
#include "cuda_status.h"  // gpu/src: FromCuda, DeviceGuard

namespace kvtier::gpu::engine::internal {
namespace {

using gpu::internal::DeviceGuard;
using gpu::internal::FromCuda;

GpuStatus FromBlas(const CublasApi& api, cublasStatus_t st, const char* what) {
  if (st == CUBLAS_STATUS_SUCCESS) return GpuStatus::Ok();
  std::string msg =
      std::string(what) + ": " + api.status_name(st) + " (" + api.status_string(st) + ")";
  switch (st) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return GpuStatus::OutOfMemory(std::move(msg));
    case CUBLAS_STATUS_INVALID_VALUE:
      return GpuStatus::InvalidArgument(std::move(msg));
    case CUBLAS_STATUS_NOT_SUPPORTED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return GpuStatus::Unsupported(std::move(msg));
    default:
      return GpuStatus::DeviceError(std::move(msg));
  }
}

cudaDataType_t BlasType(ScalarType t) {
  return t == ScalarType::kFloat16 ? CUDA_R_16F : CUDA_R_16BF;
}

cudaStream_t AsStream(Stream& stream) { return static_cast<cudaStream_t>(stream.native_handle()); }

// One cuBLAS handle, created on first use on the runtime's device and shared by all streams
// under blas_mu_ (cublasSetStream + the call). Calls set the runtime's device for the call
// and restore the caller's.
class CudaCompute final : public ComputeBackend {
 public:
  explicit CudaCompute(Runtime& runtime) : device_(runtime.device()) {}
  ~CudaCompute() override;

  GpuStatus LaunchGemm(const GemmParams& p, Stream& stream) override;
  GpuStatus LaunchKvAppend(const KvAppendParams& p, Stream& stream) override;
  GpuStatus LaunchPagedAttention(const PagedAttentionParams& p, Stream& stream) override;

 private:
  // Sets *handle to the cuBLAS handle bound to `stream`, creating it on first use.
  // REQUIRES: blas_mu_ held and device_ current.
  GpuStatus BlasOn(Stream& stream, cublasHandle_t* handle);

  const int device_;
  std::mutex blas_mu_;
  cublasHandle_t blas_ = nullptr;        // GUARDED_BY(blas_mu_); null until the first GEMM.
  const CublasApi* blas_api_ = nullptr;  // GUARDED_BY(blas_mu_); loaded with blas_
};

CudaCompute::~CudaCompute() {
  if (blas_ != nullptr) {
    DeviceGuard guard(device_);
    blas_api_->destroy(blas_);  // A destructor has nothing to report to.
  }
}

GpuStatus CudaCompute::BlasOn(Stream& stream, cublasHandle_t* handle) {
  if (blas_ == nullptr) {
    if (GpuStatus s = LoadCublas(&blas_api_); !s.ok()) return s;
    cublasHandle_t created = nullptr;
    if (GpuStatus s = FromBlas(*blas_api_, blas_api_->create(&created), "cublasCreate"); !s.ok()) {
      return s;
    }
    blas_ = created;
  }
  if (GpuStatus s =
          FromBlas(*blas_api_, blas_api_->set_stream(blas_, AsStream(stream)), "cublasSetStream");
      !s.ok()) {
    return s;
  }
  *handle = blas_;
  return GpuStatus::Ok();
}

GpuStatus CudaCompute::LaunchGemm(const GemmParams& p, Stream& stream) {
  DeviceGuard guard(device_);
  if (guard.error() != cudaSuccess) return FromCuda(guard.error(), "cudaSetDevice");
  std::lock_guard<std::mutex> lock(blas_mu_);
  cublasHandle_t handle = nullptr;
  if (GpuStatus s = BlasOn(stream, &handle); !s.ok()) return s;
  // Row-major C[m,n] = A[m,k] B[n,k]^T is column-major C^T[n,m] = B A^T: cuBLAS "TN" with
  // B as the first operand (PyTorch's nn.Linear call).
  const float alpha = 1.0f, beta = p.accumulate ? 1.0f : 0.0f;
  const cudaDataType_t t = BlasType(p.type);
  return FromBlas(
      *blas_api_,
      blas_api_->gemm_ex(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(p.n),
                         static_cast<int>(p.m), static_cast<int>(p.k), &alpha, p.b, t,
                         static_cast<int>(p.ldb), p.a, t, static_cast<int>(p.lda), &beta, p.c, t,
                         static_cast<int>(p.ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      "cublasGemmEx");
}

GpuStatus CudaCompute::LaunchKvAppend(const KvAppendParams& p, Stream& stream) {
  DeviceGuard guard(device_);
  if (guard.error() != cudaSuccess) return FromCuda(guard.error(), "cudaSetDevice");
  return FromCuda(LaunchKvAppendKernel(p, AsStream(stream)), "kv append kernel launch");
}

GpuStatus CudaCompute::LaunchPagedAttention(const PagedAttentionParams& p, Stream& stream) {
  DeviceGuard guard(device_);
  if (guard.error() != cudaSuccess) return FromCuda(guard.error(), "cudaSetDevice");
  const int64_t context = p.first_position + p.num_tokens;
  const int64_t dim = p.kv.head_dim;
  const int64_t kv_heads = p.kv.heads;
  const int64_t group = p.num_q_heads / kv_heads;
  auto* k = reinterpret_cast<uint16_t*>(p.workspace + p.ws.k_offset);
  auto* v = reinterpret_cast<uint16_t*>(p.workspace + p.ws.v_offset);
  auto* scores = reinterpret_cast<float*>(p.workspace + p.ws.scores_offset);
  auto* probs = reinterpret_cast<uint16_t*>(p.workspace + p.ws.probs_offset);
  if (GpuStatus s = FromCuda(LaunchKvGatherKernel(p.kv, context, k, v, AsStream(stream)),
                             "kv gather kernel launch");
      !s.ok()) {
    return s;
  }
  std::lock_guard<std::mutex> lock(blas_mu_);
  cublasHandle_t handle = nullptr;
  if (GpuStatus s = BlasOn(stream, &handle); !s.ok()) return s;
  const float one = 1.0f, zero = 0.0f;
  const cudaDataType_t t = BlasType(p.type);
  const auto i32 = [](int64_t v) { return static_cast<int>(v); };
  // Per query tile [t0, t0 + tq): keys [0, first + t0 + tq) only, so the masked work is the
  // tile's own diagonal block. Query head h = g * group + j reads KV head g; one
  // strided-batched call per j covers every g.
  for (int64_t t0 = 0; t0 < p.num_tokens; t0 += p.tile_tokens) {
    const int64_t tq = std::min(p.tile_tokens, p.num_tokens - t0);
    const int64_t keys = p.first_position + t0 + tq;
    const int64_t head_scores = tq * keys;  // scores[h] is [tq][keys].
    for (int64_t j = 0; j < group; ++j) {
      // scores[h] (row-major [tq, keys]) = Q_h [tq, dim] K_g [keys, dim]^T.
      const uint16_t* q = p.q + t0 * p.q_token_stride + j * dim;
      if (GpuStatus s = FromBlas(
              *blas_api_,
              blas_api_->gemm_strided_batched_ex(
                  handle, CUBLAS_OP_T, CUBLAS_OP_N, i32(keys), i32(tq), i32(dim), &one, k, t,
                  i32(dim), context * dim, q, t, i32(p.q_token_stride), group * dim, &zero,
                  scores + j * head_scores, CUDA_R_32F, i32(keys), group * head_scores,
                  i32(kv_heads), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              "cublasGemmStridedBatchedEx (QK^T)");
          !s.ok()) {
        return s;
      }
    }
    if (GpuStatus s =
            FromCuda(LaunchMaskedSoftmaxKernel(p.type, scores, probs, p.num_q_heads * tq, tq, keys,
                                               p.first_position + t0, p.scale, AsStream(stream)),
                     "softmax kernel launch");
        !s.ok()) {
      return s;
    }
    for (int64_t j = 0; j < group; ++j) {
      // out_h (row-major [tq, dim], row stride out_token_stride) = P_h [tq, keys] V_g [keys, dim].
      uint16_t* out = p.out + t0 * p.out_token_stride + j * dim;
      if (GpuStatus s =
              FromBlas(*blas_api_,
                       blas_api_->gemm_strided_batched_ex(
                           handle, CUBLAS_OP_N, CUBLAS_OP_N, i32(dim), i32(tq), i32(keys), &one, v,
                           t, i32(dim), context * dim, probs + j * head_scores, t, i32(keys),
                           group * head_scores, &zero, out, t, i32(p.out_token_stride), group * dim,
                           i32(kv_heads), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                       "cublasGemmStridedBatchedEx (PV)");
          !s.ok()) {
        return s;
      }
    }
  }
  return GpuStatus::Ok();
}

}  // namespace

std::unique_ptr<ComputeBackend> NewCudaCompute(Runtime& runtime) {
  return std::make_unique<CudaCompute>(runtime);
}

}  // namespace kvtier::gpu::engine::internal
