#include "cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "compute_kernels.h"
#include "cublas_loader.h"
#include "fill_kernel.h"
#include "host_ipc_handle.h"
#include "kv_copy_kernel.h"

namespace kvtier::gpu {
namespace {

GpuStatus FromCuda(cudaError_t err, const char* what) {
  std::string msg =
      std::string(what) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
  switch (err) {
    case cudaSuccess:
      return GpuStatus::Ok();
    case cudaErrorMemoryAllocation:
      return GpuStatus::OutOfMemory(std::move(msg));
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidDevice:
    case cudaErrorHostMemoryAlreadyRegistered:
      return GpuStatus::InvalidArgument(std::move(msg));
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
      return GpuStatus::Unavailable(std::move(msg));
    default:
      return GpuStatus::DeviceError(std::move(msg));
  }
}

// Makes `device` current for the scope and restores the caller's current device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    err_ = cudaGetDevice(&previous_);
    if (err_ == cudaSuccess && previous_ != device) {
      err_ = cudaSetDevice(device);
      restore_ = err_ == cudaSuccess;
    }
  }
  ~DeviceGuard() {
    if (restore_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

  cudaError_t error() const { return err_; }

 private:
  int previous_ = 0;
  bool restore_ = false;
  cudaError_t err_ = cudaSuccess;
};

GpuStatus FromBlas(const internal::CublasApi& api, cublasStatus_t st, const char* what) {
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

cudaStream_t AsStream(void* handle) { return static_cast<cudaStream_t>(handle); }
cudaEvent_t AsEvent(void* handle) { return static_cast<cudaEvent_t>(handle); }

void CUDART_CB RunHostFunc(void* user_data) {
  std::unique_ptr<std::function<void()>> fn(static_cast<std::function<void()>*>(user_data));
  (*fn)();
}

}  // namespace

GpuStatus CudaRuntime::Create(int device, std::unique_ptr<Runtime>* out) {
  int count = 0;
  if (cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess) {
    // No driver, a driver older than the toolkit, no device: CUDA cannot run here.
    GpuStatus s = FromCuda(err, "cudaGetDeviceCount");
    return GpuStatus::Unavailable(s.message());
  }
  if (count == 0) return GpuStatus::Unavailable("cudaGetDeviceCount: no CUDA device");
  if (device < 0 || device >= count) {
    return GpuStatus::InvalidArgument("CreateCuda: device " + std::to_string(device) +
                                      " out of range [0, " + std::to_string(count) + ")");
  }
  DeviceGuard guard(device);
  if (guard.error() != cudaSuccess) return FromCuda(guard.error(), "cudaSetDevice");
  // Initializes the device's primary context now, so that an unusable device fails here.
  if (cudaError_t err = cudaFree(nullptr); err != cudaSuccess) {
    return FromCuda(err, "initializing CUDA context");
  }
  out->reset(new CudaRuntime(device));
  return GpuStatus::Ok();
}

GpuStatus CudaRuntime::AllocateImpl(size_t bytes, DeviceBuffer* out) {
  DeviceGuard guard(device_);
  if (guard.error() != cudaSuccess) return FromCuda(guard.error(), "cudaSetDevice");
  void* data = nullptr;
  if (cudaError_t err = cudaMalloc(&data, bytes); err != cudaSuccess) {
    return FromCuda(err, ("cudaMalloc(" + std::to_string(bytes) + " bytes)").c_str());
  }
  *out = WrapBuffer(data, bytes);
  return GpuStatus::Ok();
}

void CudaRuntime::FreeImpl(void* data) noexcept {
  bool opened = false;
  {
    std::lock_guard<std::mutex> lock(ipc_mu_);
    if (auto it = opened_.find(data); it != opened_.end()) {
      opened = true;
      if (--it->second == 0) opened_.erase(it);
    } else {
      exported_.erase(data);
    }
  }
  DeviceGuard guard(device_);
  // Nothing to report to: a failure here means the context is already dead.
  if (opened) {
    cudaIpcCloseMemHandle(data);
  } else {
    cudaFree(data);
  }
}

static_assert(sizeof(cudaIpcMemHandle_t) == internal::kCudaIpcHandleBytes,
              "host_ipc_handle.h tells CUDA handles apart by their size");

GpuStatus CudaRuntime::AllocateExportedImpl(size_t bytes, DeviceBuffer* out,
                                            std::string* ipc_handle) {
  DeviceGuard guard(device_);
  if (guard.error() != cudaSuccess) return FromCuda(guard.error(), "cudaSetDevice");
  void* data = nullptr;
  if (cudaError_t err = cudaMalloc(&data, bytes); err != cudaSuccess) {
    return FromCuda(err, ("cudaMalloc(" + std::to_string(bytes) + " bytes)").c_str());
  }
  cudaIpcMemHandle_t handle;
  if (cudaError_t err = cudaIpcGetMemHandle(&handle, data); err != cudaSuccess) {
    cudaFree(data);
    return FromCuda(err, "cudaIpcGetMemHandle");
  }
  std::string text(reinterpret_cast<const char*>(&handle), sizeof(handle));
  {
    std::lock_guard<std::mutex> lock(ipc_mu_);
    exported_[data] = text;
  }
  *ipc_handle = std::move(text);
  *out = WrapBuffer(data, bytes);
  return GpuStatus::Ok();
}

GpuStatus CudaRuntime::OpenExportedImpl(std::string_view ipc_handle, size_t bytes,
                                        DeviceBuffer* out) {
  const std::string who = name_ + ": OpenExported: ";
  if (ipc_handle.starts_with(internal::kHostIpcPrefix)) {
    return GpuStatus::InvalidArgument(
        who + "the handle was made by the host backend (\"host-ipc:\" prefix), not by CUDA");
  }
  if (ipc_handle.size() != sizeof(cudaIpcMemHandle_t)) {
    return GpuStatus::InvalidArgument(
        who + "malformed handle: " + std::to_string(ipc_handle.size()) + " bytes, not the " +
        std::to_string(sizeof(cudaIpcMemHandle_t)) + " of a cudaIpcMemHandle_t");
  }
  {
    std::lock_guard<std::mutex> lock(ipc_mu_);
    for (const auto& [data, handle] : exported_) {  // A handful of exports: a scan is fine.
      if (handle == ipc_handle) {
        return GpuStatus::InvalidArgument(
            who +
            "the handle was exported by this runtime; CUDA cannot open it in the "
            "exporting process (use the exported buffer)");
      }
    }
  }
  cudaIpcMemHandle_t handle;
  std::memcpy(&handle, ipc_handle.data(), sizeof(handle));
  DeviceGuard guard(device_);
  if (guard.error() != cudaSuccess) return FromCuda(guard.error(), "cudaSetDevice");
  void* data = nullptr;
  if (cudaError_t err = cudaIpcOpenMemHandle(&data, handle, cudaIpcMemLazyEnablePeerAccess);
      err != cudaSuccess) {
    return FromCuda(err, (who + "cudaIpcOpenMemHandle").c_str());
  }
  {
    std::lock_guard<std::mutex> lock(ipc_mu_);
    ++opened_[data];
  }
  // CUDA maps the whole exported allocation and does not say how long it is: `bytes` is
  // the caller's word.
  *out = WrapBuffer(data, bytes);
  return GpuStatus::Ok();
}

GpuStatus CudaRuntime::CreateStreamImpl(Stream* out) {
  DeviceGuard guard(device_);
  if (guard.error() != cudaSuccess) return FromCuda(guard.error(), "cudaSetDevice");
  cudaStream_t stream = nullptr;
  if (cudaError_t err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
      err != cudaSuccess) {
    return FromCuda(err, "cudaStreamCreateWithFlags");
  }
  *out = WrapStream(stream);
  return GpuStatus::Ok();
}

void CudaRuntime::DestroyStreamImpl(void* handle) noexcept {
  {
    std::lock_guard lock(external_mu_);
    if (auto it = external_.find(handle); it != external_.end()) {
      if (--it->second == 0) external_.erase(it);
      return;  // the caller's stream: not ours to destroy
    }
  }
  cudaStreamDestroy(AsStream(handle));
}

GpuStatus CudaRuntime::WrapExternalStreamImpl(void* native_stream, Stream* out) {
  // A null handle is CUDA's legacy default stream; Stream needs a non-null one.
  void* handle = native_stream != nullptr ? native_stream : static_cast<void*>(cudaStreamLegacy);
  {
    std::lock_guard lock(external_mu_);
    ++external_[handle];
  }
  *out = WrapStream(handle);
  return GpuStatus::Ok();
}

GpuStatus CudaRuntime::CreateEventImpl(Event* out) {
  DeviceGuard guard(device_);
  if (guard.error() != cudaSuccess) return FromCuda(guard.error(), "cudaSetDevice");
  cudaEvent_t event = nullptr;
  if (cudaError_t err = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
      err != cudaSuccess) {
    return FromCuda(err, "cudaEventCreateWithFlags");
  }
  *out = WrapEvent(event);
  return GpuStatus::Ok();
}

void CudaRuntime::DestroyEventImpl(void* handle) noexcept { cudaEventDestroy(AsEvent(handle)); }

GpuStatus CudaRuntime::CopyAsyncImpl(void* dst, const void* src, size_t bytes, void* stream) {
  return FromCuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, AsStream(stream)),
                  "cudaMemcpyAsync");
}

GpuStatus CudaRuntime::LaunchFillImpl(void* dst, size_t bytes, uint64_t seed, void* stream) {
  DeviceGuard guard(device_);
  if (guard.error() != cudaSuccess) return FromCuda(guard.error(), "cudaSetDevice");
  return FromCuda(internal::LaunchFillKernel(dst, bytes, seed, AsStream(stream)),
                  "fill kernel launch");
}

GpuStatus CudaRuntime::LaunchHostFuncImpl(void* stream, std::function<void()> fn) {
  auto boxed = std::make_unique<std::function<void()>>(std::move(fn));
  if (cudaError_t err = cudaLaunchHostFunc(AsStream(stream), &RunHostFunc, boxed.get());
      err != cudaSuccess) {
    return FromCuda(err, "cudaLaunchHostFunc");
  }
  boxed.release();  // Owned by RunHostFunc now.
  return GpuStatus::Ok();
}

GpuStatus CudaRuntime::RecordEventImpl(void* event, void* stream) {
  return FromCuda(cudaEventRecord(AsEvent(event), AsStream(stream)), "cudaEventRecord");
}

GpuStatus CudaRuntime::QueryEventImpl(void* event, bool* complete) {
  const cudaError_t err = cudaEventQuery(AsEvent(event));
  *complete = err == cudaSuccess;
  if (err == cudaSuccess || err == cudaErrorNotReady) return GpuStatus::Ok();
  return FromCuda(err, "cudaEventQuery");
}

GpuStatus CudaRuntime::SynchronizeEventImpl(void* event) {
  return FromCuda(cudaEventSynchronize(AsEvent(event)), "cudaEventSynchronize");
}

GpuStatus CudaRuntime::StreamWaitEventImpl(void* stream, void* event) {
  return FromCuda(cudaStreamWaitEvent(AsStream(stream), AsEvent(event), 0), "cudaStreamWaitEvent");
}

GpuStatus CudaRuntime::SynchronizeImpl(void* stream) {
  return FromCuda(cudaStreamSynchronize(AsStream(stream)), "cudaStreamSynchronize");
}

GpuStatus CudaRuntime::EventCompletionTimeImpl(void*, std::chrono::steady_clock::time_point*) {
  return GpuStatus::Unsupported("CUDA events are created with cudaEventDisableTiming");
}

GpuStatus CudaRuntime::RegisterHostPieceImpl(void* host, size_t bytes, void** device) {
  DeviceGuard guard(device_);
  if (guard.error() != cudaSuccess) return FromCuda(guard.error(), "cudaSetDevice");
  if (cudaError_t err =
          cudaHostRegister(host, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
      err != cudaSuccess) {
    return FromCuda(err, ("cudaHostRegister(" + std::to_string(bytes) + " bytes)").c_str());
  }
  if (cudaError_t err = cudaHostGetDevicePointer(device, host, 0); err != cudaSuccess) {
    cudaHostUnregister(host);
    return FromCuda(err, "cudaHostGetDevicePointer");
  }
  return GpuStatus::Ok();
}

void CudaRuntime::UnregisterHostPieceImpl(void* host) noexcept {
  DeviceGuard guard(device_);
  cudaHostUnregister(host);  // Nothing to report to (see FreeImpl).
}

GpuStatus CudaRuntime::MapHostImpl(const void*, size_t) { return GpuStatus::Ok(); }

GpuStatus CudaRuntime::LaunchKvCopyImpl(const internal::KvCopyParams& params, void* stream) {
  DeviceGuard guard(device_);
  if (guard.error() != cudaSuccess) return FromCuda(guard.error(), "cudaSetDevice");
  return FromCuda(internal::LaunchKvCopyKernel(params, AsStream(stream)), "kv copy kernel launch");
}

CudaRuntime::~CudaRuntime() {
  if (blas_ != nullptr) {
    DeviceGuard guard(device_);
    blas_api_->destroy(blas_);  // Nothing to report to (see FreeImpl).
  }
}

GpuStatus CudaRuntime::BlasOn(void* stream, cublasContext** handle) {
  if (blas_ == nullptr) {
    if (GpuStatus s = internal::LoadCublas(&blas_api_); !s.ok()) return s;
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

GpuStatus CudaRuntime::LaunchMemsetImpl(void* dst, uint8_t value, size_t bytes, void* stream) {
  DeviceGuard guard(device_);
  if (guard.error() != cudaSuccess) return FromCuda(guard.error(), "cudaSetDevice");
  return FromCuda(cudaMemsetAsync(dst, value, bytes, AsStream(stream)), "cudaMemsetAsync");
}

GpuStatus CudaRuntime::LaunchGemmImpl(const internal::GemmParams& p, void* stream) {
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

GpuStatus CudaRuntime::LaunchKvAppendImpl(const internal::KvAppendParams& p, void* stream) {
  DeviceGuard guard(device_);
  if (guard.error() != cudaSuccess) return FromCuda(guard.error(), "cudaSetDevice");
  return FromCuda(internal::LaunchKvAppendKernel(p, AsStream(stream)), "kv append kernel launch");
}

GpuStatus CudaRuntime::LaunchPagedAttentionImpl(const internal::PagedAttentionParams& p,
                                                void* stream) {
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
  if (GpuStatus s = FromCuda(internal::LaunchKvGatherKernel(p.kv, context, k, v, AsStream(stream)),
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
    if (GpuStatus s = FromCuda(
            internal::LaunchMaskedSoftmaxKernel(p.type, scores, probs, p.num_q_heads * tq, tq, keys,
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

}  // namespace kvtier::gpu
