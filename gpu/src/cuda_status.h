// CUDA runtime errors as GpuStatus, and a scoped current device: shared by the CUDA backend
// (cuda_backend.cc) and the test engine's CUDA compute (engine/compute_cuda.cc). Private to
// gpu/; only for sources built when KVTIER_HAVE_CUDA.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <utility>

#include "kvtier/gpu/gpu_status.h"

namespace kvtier::gpu::internal {

// OK for cudaSuccess; otherwise "what: <name> (<description>)" with the code that fits.
inline GpuStatus FromCuda(cudaError_t err, const char* what) {
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

}  // namespace kvtier::gpu::internal
