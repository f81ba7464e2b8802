// HostRuntime: the host-emulation backend of Runtime (private to gpu/).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "kvtier/gpu/runtime.h"

namespace kvtier::gpu {

// Device memory is host memory from aligned operator new; exported memory is a memfd
// mapped MAP_SHARED, which other processes open through /proc/<pid>/fd (host_ipc_handle.h).
// Each Stream is a worker thread that runs its queue in order; each Event record is a
// completion flag stamped with the steady_clock time it fired. Queued work cannot fail;
// enqueueing fails where HostRuntimeOptions::inject_fault says so (not AllocateExported or
// OpenExported). Host registration is bookkeeping that rejects overlapping registrations,
// as CUDA does. Thread-safe; registered_mu_ and mappings_mu_ are never held together.
class HostRuntime final : public Runtime {
 public:
  explicit HostRuntime(HostRuntimeOptions options) : options_(std::move(options)) {}

  Backend backend() const override { return Backend::kHost; }
  std::string_view name() const override { return "host"; }
  int device() const override { return -1; }

 protected:
  GpuStatus AllocateImpl(size_t bytes, DeviceBuffer* out) override;
  void FreeImpl(void* data) noexcept override;
  GpuStatus AllocateExportedImpl(size_t bytes, DeviceBuffer* out, std::string* ipc_handle) override;
  GpuStatus OpenExportedImpl(std::string_view ipc_handle, size_t bytes, DeviceBuffer* out) override;
  GpuStatus CreateStreamImpl(Stream* out) override;
  void DestroyStreamImpl(void* handle) noexcept override;
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
  // kDeviceError when the injected fault hook claims [ptr, ptr + bytes).
  GpuStatus CheckFault(const void* ptr, size_t bytes, const char* what) const;

  // A buffer of AllocateExportedImpl or OpenExportedImpl: mmapped, so FreeImpl munmaps it
  // instead of operator delete.
  struct Mapping {
    size_t bytes = 0;  // Length of the mapping.
    int fd = -1;       // Exported: the memfd, kept open for openers. Opened: -1 (closed).
  };

  const HostRuntimeOptions options_;
  std::mutex mappings_mu_;
  std::unordered_map<void*, Mapping> mappings_;  // GUARDED_BY(mappings_mu_): by data().

  std::mutex registered_mu_;
  std::map<uintptr_t, uintptr_t> registered_;  // GUARDED_BY(registered_mu_): start -> end.
};

}  // namespace kvtier::gpu
