#include "cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "cuda_status.h"
#include "fill_kernel.h"
#include "host_ipc_handle.h"
#include "kv_copy_kernel.h"

namespace kvtier::gpu {
namespace {

using internal::DeviceGuard;
using internal::FromCuda;

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

GpuStatus CudaRuntime::LaunchMemsetImpl(void* dst, uint8_t value, size_t bytes, void* stream) {
  DeviceGuard guard(device_);
  if (guard.error() != cudaSuccess) return FromCuda(guard.error(), "cudaSetDevice");
  return FromCuda(cudaMemsetAsync(dst, value, bytes, AsStream(stream)), "cudaMemsetAsync");
}

}  // namespace kvtier::gpu
