#include "cuda_backend.h"

#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <utility>

#include "fill_kernel.h"
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
  DeviceGuard guard(device_);
  cudaFree(data);  // Nothing to report to: a failure here means the context is already dead.
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

void CudaRuntime::DestroyStreamImpl(void* handle) noexcept { cudaStreamDestroy(AsStream(handle)); }

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

}  // namespace kvtier::gpu
