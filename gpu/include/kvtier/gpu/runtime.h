// Runtime: the small device interface behind which kvtier's GPU work runs.
//
// Two backends: CUDA (Runtime::CreateCuda) and host emulation (Runtime::CreateHost), where
// device memory is host memory and each stream is a worker thread, so that every pipeline
// test runs on a CPU-only machine. The test engine's GEMM and attention are not part of it:
// they run on a Runtime's streams from kvtier/gpu/engine/compute.h (kvtier_gpu_compute).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "kvtier/gpu/device_buffer.h"
#include "kvtier/gpu/event.h"
#include "kvtier/gpu/gpu_status.h"
#include "kvtier/gpu/kv_copy.h"
#include "kvtier/gpu/pinned_range.h"
#include "kvtier/gpu/stream.h"

namespace kvtier::gpu {

enum class Backend : uint8_t { kHost, kCuda };

namespace internal {
struct KvCopyParams;  // src/kv_copy_params.h
}  // namespace internal

// Options of the host-emulation backend.
struct HostRuntimeOptions {
  // Fault injection for tests (the emulated device failing on a host range). Called at
  // enqueue time, from the calling thread, with every range CopyAsync reads or writes and
  // every range MapHost translates; returning true makes that call fail with kDeviceError
  // and queue nothing, as CUDA fails a copy or mapping on an unusable host range. Must be
  // thread-safe. Default: empty (no faults).
  std::function<bool(const void* ptr, size_t bytes)> inject_fault;
};

// Public methods are non-virtual: they validate arguments and handles, then call the
// backend's protected *Impl. Every method returns kInvalidArgument for a null out-pointer
// or an empty handle or one made by another Runtime, besides the codes listed per method.
// A call that fails changes nothing: out-parameters keep their value and no work is queued.
//
// Asynchrony: *Async/Launch*/Record/StreamWaitEvent only queue work and return at once.
// CUDA reports errors of queued work later, from QueryEvent, SynchronizeEvent or
// Synchronize (kDeviceError); the host backend's queued work cannot fail.
//
// Thread-safety: all methods are thread-safe. Handles (DeviceBuffer, Stream, Event) must
// not outlive the Runtime that made them: destroying a Runtime while any of its handles
// lives aborts the process with a message (it would otherwise be a use-after-free).
class Runtime {
 public:
  // Every DeviceBuffer's data() is a multiple of this (cudaMalloc's guarantee).
  static constexpr size_t kDeviceAlignmentBytes = 256;

  // Host-emulation backend. Never fails.
  static std::unique_ptr<Runtime> CreateHost();
  static std::unique_ptr<Runtime> CreateHost(HostRuntimeOptions options);

  // CUDA backend on device ordinal `device`. Does not change the calling thread's current
  // device. Errors: kUnavailable when built without CUDA, when the driver is missing or
  // too old, or when no GPU is present; kInvalidArgument when `device` is out of range;
  // kDeviceError for other CUDA failures.
  static GpuStatus CreateCuda(int device, std::unique_ptr<Runtime>* out);

  virtual ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  virtual Backend backend() const = 0;
  // "host" or "cuda:<device>".
  virtual std::string_view name() const = 0;
  // CUDA: the device ordinal given to CreateCuda (for launching the caller's own kernels
  // and libraries on this runtime's device); host backend: -1.
  virtual int device() const = 0;

  // Allocates `bytes` (> 0) of uninitialized device memory into *out; on success what *out
  // held before is freed. Errors: kInvalidArgument (bytes == 0), kOutOfMemory, kDeviceError.
  GpuStatus Allocate(size_t bytes, DeviceBuffer* out);

  // Allocates `bytes` (> 0) of uninitialized device memory that other processes on the same
  // machine (CUDA: using the same GPU) can open with OpenExported, into *out, and sets
  // *ipc_handle to the opaque handle to send them; on success what *out held before is
  // freed. The handle is bytes to ship as they are (not text): CUDA: the 64-byte
  // cudaIpcMemHandle_t of a cudaMalloc allocation; host backend: "host-ipc:v1:<pid>:<fd>:
  // <bytes>" naming a memfd of this process, which an opener reaches through /proc (so it
  // must run as the same user). The handle stays valid until *out is freed; freeing it while
  // another process still has the memory open is allowed (CUDA and the kernel keep the
  // memory until the last mapping goes). Errors: as Allocate.
  GpuStatus AllocateExported(size_t bytes, DeviceBuffer* out, std::string* ipc_handle);

  // Opens the first `bytes` of memory another process exported with AllocateExported, into
  // *out; on success what *out held before is freed. Freeing *out closes the mapping (CUDA:
  // cudaIpcCloseMemHandle), not the exporter's memory. CUDA: cudaIpcOpenMemHandle with
  // cudaIpcMemLazyEnablePeerAccess on this runtime's device; CUDA refuses to open a handle
  // in the process that exported it (use the exported buffer there). The host backend
  // opens it in any process, the exporter included, as a second mapping of the same pages.
  // Errors: kInvalidArgument (empty or malformed handle, one made by the other backend,
  // bytes == 0, bytes larger than the exported size where the handle tells it: host
  // backend only, a CUDA handle does not carry the size), kUnavailable (host backend: the
  // exporting process or its export is gone, or it runs as another user), kDeviceError
  // otherwise. The message names what is wrong.
  GpuStatus OpenExported(std::string_view ipc_handle, size_t bytes, DeviceBuffer* out);

  // Creates a stream into *out. Errors: kDeviceError, kInternal.
  GpuStatus CreateStream(Stream* out);

  // Wraps a stream the caller made and owns into *out, such as an engine's compute stream
  // (CUDA: a cudaStream_t, e.g. torch.cuda.current_stream().cuda_stream; nullptr names the
  // legacy default stream, as in CUDA), so that kvtier can order work against it
  // (LayerwiseLoader::WaitLayer, LayerwiseStorer::LayerDone). Destroying the handle leaves
  // the stream alone. REQUIRES: the stream belongs to this runtime's device and outlives
  // the handle. Errors: kUnsupported (host backend: its streams are worker threads).
  GpuStatus WrapExternalStream(void* native_stream, Stream* out);

  // Creates an event into *out; it counts as complete until first recorded.
  // Errors: kDeviceError.
  GpuStatus CreateEvent(Event* out);

  // Queues a copy of `bytes` from `src` to `dst` on `stream`; each side may be device
  // memory of this runtime or host memory (direction is inferred, as cudaMemcpyDefault).
  // bytes == 0 queues nothing. Host memory should be pinned for the copy to be truly
  // asynchronous under CUDA. REQUIRES: both ranges stay valid until the copy completes.
  // Errors: kInvalidArgument (null pointer with bytes > 0, overlapping ranges), kDeviceError.
  GpuStatus CopyAsync(void* dst, const void* src, size_t bytes, Stream& stream);

  // Queues a fill of device memory [dst, dst + bytes) with the kvtier test pattern: byte at
  // offset i is byte (i % 8) (little-endian) of the 64-bit word W(seed, i / 8), where
  // W(s, w) = SplitMix64 finalizer of (s + (w + 1) * 0x9E3779B97F4A7C15), i.e. output w
  // (0-based) of a SplitMix64 generator seeded with s. Offsets are relative to dst.
  // CUDA: runs a kernel (fill_kernel.cu). bytes == 0 queues nothing.
  // Errors: kInvalidArgument (null dst with bytes > 0), kDeviceError.
  GpuStatus LaunchFill(void* dst, size_t bytes, uint64_t seed, Stream& stream);

  // Queues `fn` to run on a runtime-owned host thread once earlier work on `stream` is
  // done; later work on `stream` waits for it to return. `fn` must not call this Runtime
  // and must not throw. Under CUDA, `fn` never runs (and leaks) if the stream fails.
  // Errors: kInvalidArgument (empty fn), kDeviceError.
  GpuStatus LaunchHostFunc(Stream& stream, std::function<void()> fn);

  // Records `event` to complete when all work queued on `stream` so far has completed.
  // Errors: kDeviceError.
  GpuStatus RecordEvent(Event& event, Stream& stream);

  // Sets *complete to whether the event's latest record has completed (true if never
  // recorded). Does not block. Errors: kDeviceError (including async errors of work before
  // the record).
  GpuStatus QueryEvent(const Event& event, bool* complete);

  // Blocks the calling thread until the event's latest record has completed.
  // Errors: kDeviceError.
  GpuStatus SynchronizeEvent(const Event& event);

  // Makes work queued on `stream` after this call wait until the event's latest record (as
  // of this call) has completed, without blocking the host. A never-recorded event adds no
  // wait. Errors: kDeviceError.
  GpuStatus StreamWaitEvent(Stream& stream, const Event& event);

  // Blocks the calling thread until all work queued on `stream` so far has completed.
  // Errors: kDeviceError.
  GpuStatus Synchronize(Stream& stream);

  // Page-locks and device-maps host memory [ptr, ptr + bytes) into *out, in pieces of at
  // most options.max_piece_bytes (see PinOptions); on success what *out held before is
  // unregistered. Either every piece is registered or none is. CUDA: cudaHostRegister with
  // cudaHostRegisterMapped | cudaHostRegisterPortable; host backend: no-op bookkeeping.
  // Errors: kInvalidArgument (null ptr, bytes == 0, bad max_piece_bytes, range already
  // registered), kOutOfMemory (the OS cannot lock that much), kDeviceError.
  GpuStatus RegisterHost(void* ptr, size_t bytes, const PinOptions& options, PinnedRange* out);

  // Sets *device to the address at which device code (kernels) reaches host memory
  // [host, host + bytes) of `range` (equal to `host` on UVA systems that can use host
  // pointers for registered memory, and always on the host backend). The range must lie in
  // one piece, or in pieces whose device addresses are contiguous.
  // Errors: kInvalidArgument (range empty or foreign, [host, host + bytes) not inside it or
  // across non-contiguous pieces), kDeviceError (host backend: an injected fault).
  GpuStatus MapHost(const PinnedRange& range, const void* host, size_t bytes, void** device);

  // Queues one gather or scatter of a layer of many chunks (see KvLayerCopy) on `stream`.
  // CUDA: one kernel launch; host backend: the same copy on the stream's thread.
  // num_chunks == 0 queues nothing. REQUIRES: the arrays, tensors and payloads stay valid
  // until the launch completes.
  // Errors: kInvalidArgument (null layout, array or tensor; chunk_tokens not a positive
  // multiple of the block size; payload_align_bytes not a power of two), kDeviceError.
  GpuStatus LaunchKvCopy(const KvLayerCopy& copy, Stream& stream);

  // Queues setting device memory [dst, dst + bytes) to the byte `value` (cudaMemsetAsync).
  // bytes == 0 queues nothing. Errors: kInvalidArgument (null dst with bytes > 0),
  // kDeviceError.
  GpuStatus LaunchMemset(void* dst, uint8_t value, size_t bytes, Stream& stream);

  // Sets *at to the steady_clock time at which the event's latest record completed.
  // Host backend only (CUDA events are created with timing disabled).
  // Errors: kUnsupported (CUDA), kInvalidArgument (never recorded or not complete yet).
  GpuStatus EventCompletionTime(const Event& event, std::chrono::steady_clock::time_point* at);

 protected:
  Runtime() = default;

  // Helpers for backends to wrap raw handles; the handles call the *Free/Destroy*Impl
  // below when they are destroyed.
  DeviceBuffer WrapBuffer(void* data, size_t bytes) {
    live_handles_.fetch_add(1, std::memory_order_relaxed);
    return DeviceBuffer(this, data, bytes);
  }
  Stream WrapStream(void* handle) {
    live_handles_.fetch_add(1, std::memory_order_relaxed);
    return Stream(this, handle);
  }
  Event WrapEvent(void* handle) {
    live_handles_.fetch_add(1, std::memory_order_relaxed);
    return Event(this, handle);
  }

  // Arguments are validated by the public methods: sizes > 0, pointers non-null, handles
  // valid and owned by this runtime.
  virtual GpuStatus AllocateImpl(size_t bytes, DeviceBuffer* out) = 0;
  // Frees memory from AllocateImpl, AllocateExportedImpl or OpenExportedImpl alike: the
  // backend remembers which pointers the last two made.
  virtual void FreeImpl(void* data) noexcept = 0;
  virtual GpuStatus AllocateExportedImpl(size_t bytes, DeviceBuffer* out,
                                         std::string* ipc_handle) = 0;
  // `ipc_handle` is non-empty; its format is checked by the backend.
  virtual GpuStatus OpenExportedImpl(std::string_view ipc_handle, size_t bytes,
                                     DeviceBuffer* out) = 0;
  virtual GpuStatus CreateStreamImpl(Stream* out) = 0;
  // Default: kUnsupported.
  virtual GpuStatus WrapExternalStreamImpl(void* native_stream, Stream* out);
  virtual void DestroyStreamImpl(void* handle) noexcept = 0;
  virtual GpuStatus CreateEventImpl(Event* out) = 0;
  virtual void DestroyEventImpl(void* handle) noexcept = 0;
  virtual GpuStatus CopyAsyncImpl(void* dst, const void* src, size_t bytes, void* stream) = 0;
  virtual GpuStatus LaunchFillImpl(void* dst, size_t bytes, uint64_t seed, void* stream) = 0;
  virtual GpuStatus LaunchHostFuncImpl(void* stream, std::function<void()> fn) = 0;
  virtual GpuStatus RecordEventImpl(void* event, void* stream) = 0;
  virtual GpuStatus QueryEventImpl(void* event, bool* complete) = 0;
  virtual GpuStatus SynchronizeEventImpl(void* event) = 0;
  virtual GpuStatus StreamWaitEventImpl(void* stream, void* event) = 0;
  virtual GpuStatus SynchronizeImpl(void* stream) = 0;
  virtual GpuStatus EventCompletionTimeImpl(void* event,
                                            std::chrono::steady_clock::time_point* at) = 0;
  // Registers one piece (page-aligned split done by RegisterHost); sets *device.
  virtual GpuStatus RegisterHostPieceImpl(void* host, size_t bytes, void** device) = 0;
  virtual void UnregisterHostPieceImpl(void* host) noexcept = 0;
  // Backend check of a host range about to be mapped; the address arithmetic is generic.
  virtual GpuStatus MapHostImpl(const void* host, size_t bytes) = 0;
  virtual GpuStatus LaunchKvCopyImpl(const internal::KvCopyParams& params, void* stream) = 0;
  virtual GpuStatus LaunchMemsetImpl(void* dst, uint8_t value, size_t bytes, void* stream) = 0;

 private:
  friend class DeviceBuffer;
  friend class Stream;
  friend class Event;
  friend class PinnedRange;

  GpuStatus CheckStream(const Stream& stream) const;
  GpuStatus CheckEvent(const Event& event) const;
  // Called by a handle after it freed/destroyed what it owned.
  void HandleReleased() { live_handles_.fetch_sub(1, std::memory_order_relaxed); }

  std::atomic<int64_t> live_handles_{0};  // Handles made by Wrap* and not yet released.
};

}  // namespace kvtier::gpu
