// CudaRuntime: the CUDA backend of Runtime (private to gpu/; built when KVTIER_HAVE_CUDA).
// The file is not named cuda_runtime.h so that it cannot shadow CUDA's <cuda_runtime.h>.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "kvtier/gpu/runtime.h"

namespace kvtier::gpu {

// One CUDA device. Memory from cudaMalloc, streams from cudaStreamCreateWithFlags
// (cudaStreamNonBlocking: no implicit sync with the legacy default stream), events from
// cudaEventCreateWithFlags(cudaEventDisableTiming), copies by cudaMemcpyAsync
// (cudaMemcpyDefault). Calls that need a current device set it for the call and restore
// the caller's. Exported memory is cudaMalloc'd and named by cudaIpcGetMemHandle; opened
// memory comes from cudaIpcOpenMemHandle and is freed by cudaIpcCloseMemHandle.
// Thread-safe. (The test engine's GEMMs and attention are not here: gpu/src/engine/
// compute_cuda.cc, in kvtier_gpu_compute.)
class CudaRuntime final : public Runtime {
 public:
  // See Runtime::CreateCuda.
  static GpuStatus Create(int device, std::unique_ptr<Runtime>* out);

  Backend backend() const override { return Backend::kCuda; }
  std::string_view name() const override { return name_; }
  int device() const override { return device_; }

 protected:
  GpuStatus AllocateImpl(size_t bytes, DeviceBuffer* out) override;
  void FreeImpl(void* data) noexcept override;
  GpuStatus AllocateExportedImpl(size_t bytes, DeviceBuffer* out, std::string* ipc_handle) override;
  GpuStatus OpenExportedImpl(std::string_view ipc_handle, size_t bytes, DeviceBuffer* out) override;
  GpuStatus CreateStreamImpl(Stream* out) override;
  void DestroyStreamImpl(void* handle) noexcept override;
  GpuStatus WrapExternalStreamImpl(void* native_stream, Stream* out) override;
  GpuStatus CreateEventImpl(Event* out) override;
  void DestroyEventImpl(void* handle) noexcept override;
  GpuStatus CopyAsyncImpl(void* dst, const void* src, size_t bytes, void* stream) override;
  GpuStatus LaunchFillImpl(void* dst, size_t bytes, uint64_t seed, void* stream) override;
  GpuStatus LaunchHostFuncImpl(void* stream, std::function<void()> fn) override;
  GpuStatus RecordEventImpl(void* event, void* stream) override;
  GpuStatus QueryEventImpl(void* event, bool* complete) override;
  GpuStatus SynchronizeEventImpl(void* event) override;
  GpuStatus StreamWaitEventImpl(void* stream, void* event) override;
  GpuStatus SynchronizeImpl(void* stream) override;
  GpuStatus EventCompletionTimeImpl(void* event,
                                    std::chrono::steady_clock::time_point* at) override;
  GpuStatus RegisterHostPieceImpl(void* host, size_t bytes, void** device) override;
  void UnregisterHostPieceImpl(void* host) noexcept override;
  GpuStatus MapHostImpl(const void* host, size_t bytes) override;
  GpuStatus LaunchKvCopyImpl(const internal::KvCopyParams& params, void* stream) override;
  GpuStatus LaunchMemsetImpl(void* dst, uint8_t value, size_t bytes, void* stream) override;

 private:
  explicit CudaRuntime(int device) : device_(device), name_("cuda:" + std::to_string(device)) {}

  const int device_;
  const std::string name_;
  std::mutex external_mu_;
  // Streams wrapped by WrapExternalStream (not ours to destroy), with how many handles each.
  std::unordered_map<void*, int> external_;  // GUARDED_BY(external_mu_)
  std::mutex ipc_mu_;
  // Live exported allocations -> their handle, so that opening one's own handle is refused
  // with a clear message (CUDA refuses it in the exporting process anyway).
  std::unordered_map<void*, std::string> exported_;  // GUARDED_BY(ipc_mu_)
  // Opened pointers -> how many DeviceBuffers hold them: CUDA returns the same pointer,
  // reference counted, when a context opens one handle twice; each open needs a close.
  std::unordered_map<void*, int> opened_;  // GUARDED_BY(ipc_mu_)
};

}  // namespace kvtier::gpu
