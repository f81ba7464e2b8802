#include "kvtier/gpu/runtime.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "host_runtime.h"
#include "kv_copy_params.h"
#if KVTIER_HAVE_CUDA
#include "cuda_backend.h"
#endif

namespace kvtier::gpu {

std::unique_ptr<Runtime> Runtime::CreateHost() { return CreateHost(HostRuntimeOptions()); }

std::unique_ptr<Runtime> Runtime::CreateHost(HostRuntimeOptions options) {
  return std::make_unique<HostRuntime>(std::move(options));
}

GpuStatus Runtime::CreateCuda(int device, std::unique_ptr<Runtime>* out) {
  if (out == nullptr) return GpuStatus::InvalidArgument("CreateCuda: out is null");
#if KVTIER_HAVE_CUDA
  return CudaRuntime::Create(device, out);
#else
  (void)device;
  return GpuStatus::Unavailable("CreateCuda: kvtier was built without CUDA (KVTIER_WITH_CUDA)");
#endif
}

Runtime::~Runtime() {
  const int64_t live = live_handles_.load();
  if (live != 0) {
    std::fprintf(stderr,
                 "kvtier::gpu::Runtime destroyed while %lld of its buffers, streams or events "
                 "are alive; destroy the handles first\n",
                 static_cast<long long>(live));
    std::abort();
  }
}

GpuStatus Runtime::CheckStream(const Stream& stream) const {
  if (!stream.valid()) return GpuStatus::InvalidArgument("stream is empty");
  if (stream.runtime() != this) {
    return GpuStatus::InvalidArgument("stream belongs to another runtime");
  }
  return GpuStatus::Ok();
}

GpuStatus Runtime::CheckEvent(const Event& event) const {
  if (!event.valid()) return GpuStatus::InvalidArgument("event is empty");
  if (event.runtime() != this) {
    return GpuStatus::InvalidArgument("event belongs to another runtime");
  }
  return GpuStatus::Ok();
}

GpuStatus Runtime::Allocate(size_t bytes, DeviceBuffer* out) {
  if (out == nullptr) return GpuStatus::InvalidArgument("Allocate: out is null");
  if (bytes == 0) return GpuStatus::InvalidArgument("Allocate: bytes must be > 0");
  DeviceBuffer fresh;
  if (GpuStatus s = AllocateImpl(bytes, &fresh); !s.ok()) return s;
  *out = std::move(fresh);
  return GpuStatus::Ok();
}

GpuStatus Runtime::AllocateExported(size_t bytes, DeviceBuffer* out, std::string* ipc_handle) {
  if (out == nullptr || ipc_handle == nullptr) {
    return GpuStatus::InvalidArgument("AllocateExported: out or ipc_handle is null");
  }
  if (bytes == 0) return GpuStatus::InvalidArgument("AllocateExported: bytes must be > 0");
  DeviceBuffer fresh;
  std::string handle;
  if (GpuStatus s = AllocateExportedImpl(bytes, &fresh, &handle); !s.ok()) return s;
  *out = std::move(fresh);
  *ipc_handle = std::move(handle);
  return GpuStatus::Ok();
}

GpuStatus Runtime::OpenExported(std::string_view ipc_handle, size_t bytes, DeviceBuffer* out) {
  if (out == nullptr) return GpuStatus::InvalidArgument("OpenExported: out is null");
  if (ipc_handle.empty()) return GpuStatus::InvalidArgument("OpenExported: ipc_handle is empty");
  if (bytes == 0) return GpuStatus::InvalidArgument("OpenExported: bytes must be > 0");
  DeviceBuffer fresh;
  if (GpuStatus s = OpenExportedImpl(ipc_handle, bytes, &fresh); !s.ok()) return s;
  *out = std::move(fresh);
  return GpuStatus::Ok();
}

GpuStatus Runtime::CreateStream(Stream* out) {
  if (out == nullptr) return GpuStatus::InvalidArgument("CreateStream: out is null");
  Stream fresh;
  if (GpuStatus s = CreateStreamImpl(&fresh); !s.ok()) return s;
  *out = std::move(fresh);
  return GpuStatus::Ok();
}

GpuStatus Runtime::WrapExternalStream(void* native_stream, Stream* out) {
  if (out == nullptr) return GpuStatus::InvalidArgument("WrapExternalStream: out is null");
  Stream wrapped;
  if (GpuStatus s = WrapExternalStreamImpl(native_stream, &wrapped); !s.ok()) return s;
  *out = std::move(wrapped);
  return GpuStatus::Ok();
}

GpuStatus Runtime::WrapExternalStreamImpl(void* /*native_stream*/, Stream* /*out*/) {
  return GpuStatus::Unsupported("WrapExternalStream: the " + std::string(name()) +
                                " backend has no native streams to wrap");
}

GpuStatus Runtime::CreateEvent(Event* out) {
  if (out == nullptr) return GpuStatus::InvalidArgument("CreateEvent: out is null");
  Event fresh;
  if (GpuStatus s = CreateEventImpl(&fresh); !s.ok()) return s;
  *out = std::move(fresh);
  return GpuStatus::Ok();
}

GpuStatus Runtime::CopyAsync(void* dst, const void* src, size_t bytes, Stream& stream) {
  if (GpuStatus s = CheckStream(stream); !s.ok()) return s;
  if (bytes == 0) return GpuStatus::Ok();
  if (dst == nullptr || src == nullptr) {
    return GpuStatus::InvalidArgument("CopyAsync: null pointer with bytes = " +
                                      std::to_string(bytes));
  }
  const auto d = reinterpret_cast<uintptr_t>(dst);
  const auto s = reinterpret_cast<uintptr_t>(src);
  if ((d >= s ? d - s : s - d) < bytes) {
    return GpuStatus::InvalidArgument("CopyAsync: source and destination ranges overlap");
  }
  return CopyAsyncImpl(dst, src, bytes, stream.native_handle());
}

GpuStatus Runtime::LaunchFill(void* dst, size_t bytes, uint64_t seed, Stream& stream) {
  if (GpuStatus s = CheckStream(stream); !s.ok()) return s;
  if (bytes == 0) return GpuStatus::Ok();
  if (dst == nullptr) return GpuStatus::InvalidArgument("LaunchFill: dst is null");
  return LaunchFillImpl(dst, bytes, seed, stream.native_handle());
}

GpuStatus Runtime::LaunchHostFunc(Stream& stream, std::function<void()> fn) {
  if (GpuStatus s = CheckStream(stream); !s.ok()) return s;
  if (!fn) return GpuStatus::InvalidArgument("LaunchHostFunc: fn is empty");
  return LaunchHostFuncImpl(stream.native_handle(), std::move(fn));
}

GpuStatus Runtime::RecordEvent(Event& event, Stream& stream) {
  if (GpuStatus s = CheckEvent(event); !s.ok()) return s;
  if (GpuStatus s = CheckStream(stream); !s.ok()) return s;
  return RecordEventImpl(event.native_handle(), stream.native_handle());
}

GpuStatus Runtime::QueryEvent(const Event& event, bool* complete) {
  if (complete == nullptr) return GpuStatus::InvalidArgument("QueryEvent: complete is null");
  if (GpuStatus s = CheckEvent(event); !s.ok()) return s;
  return QueryEventImpl(event.native_handle(), complete);
}

GpuStatus Runtime::SynchronizeEvent(const Event& event) {
  if (GpuStatus s = CheckEvent(event); !s.ok()) return s;
  return SynchronizeEventImpl(event.native_handle());
}

GpuStatus Runtime::StreamWaitEvent(Stream& stream, const Event& event) {
  if (GpuStatus s = CheckStream(stream); !s.ok()) return s;
  if (GpuStatus s = CheckEvent(event); !s.ok()) return s;
  return StreamWaitEventImpl(stream.native_handle(), event.native_handle());
}

GpuStatus Runtime::Synchronize(Stream& stream) {
  if (GpuStatus s = CheckStream(stream); !s.ok()) return s;
  return SynchronizeImpl(stream.native_handle());
}

GpuStatus Runtime::RegisterHost(void* ptr, size_t bytes, const PinOptions& options,
                                PinnedRange* out) {
  constexpr size_t kPage = 4096;
  constexpr size_t kMaxPiece = size_t{64} << 30;
  if (out == nullptr) return GpuStatus::InvalidArgument("RegisterHost: out is null");
  if (ptr == nullptr || bytes == 0) {
    return GpuStatus::InvalidArgument("RegisterHost: null pointer or zero bytes");
  }
  const size_t max_piece = options.max_piece_bytes;
  if (max_piece < kPage || max_piece > kMaxPiece || max_piece % kPage != 0) {
    return GpuStatus::InvalidArgument("RegisterHost: max_piece_bytes " + std::to_string(max_piece) +
                                      " is not a multiple of 4096 in [4096, 64 GiB]");
  }
  const auto start = reinterpret_cast<uintptr_t>(ptr);
  if (start + bytes < start) return GpuStatus::InvalidArgument("RegisterHost: range wraps");
  const uintptr_t end = start + bytes;
  std::vector<PinnedPiece> pieces;
  for (uintptr_t at = start; at < end;) {
    uintptr_t limit = at + max_piece;
    limit = limit < end ? limit / kPage * kPage : end;  // Split at 4 KiB boundaries only.
    PinnedPiece piece{reinterpret_cast<void*>(at), nullptr, limit - at};
    if (GpuStatus s = RegisterHostPieceImpl(piece.host, piece.bytes, &piece.device); !s.ok()) {
      for (const PinnedPiece& done : pieces) UnregisterHostPieceImpl(done.host);
      return s;
    }
    pieces.push_back(piece);
    at = limit;
  }
  live_handles_.fetch_add(1, std::memory_order_relaxed);
  *out = PinnedRange(this, std::move(pieces), bytes);
  return GpuStatus::Ok();
}

GpuStatus Runtime::MapHost(const PinnedRange& range, const void* host, size_t bytes,
                           void** device) {
  if (device == nullptr) return GpuStatus::InvalidArgument("MapHost: device is null");
  if (range.empty() || range.runtime() != this) {
    return GpuStatus::InvalidArgument("MapHost: range is empty or belongs to another runtime");
  }
  if (host == nullptr || bytes == 0 || !range.Contains(host, bytes)) {
    return GpuStatus::InvalidArgument("MapHost: [host, host + " + std::to_string(bytes) +
                                      ") is not inside the registered range");
  }
  const auto h = reinterpret_cast<uintptr_t>(host);
  const std::vector<PinnedPiece>& pieces = range.pieces();
  size_t i = 0;
  while (reinterpret_cast<uintptr_t>(pieces[i].host) + pieces[i].bytes <= h) ++i;
  const PinnedPiece& first = pieces[i];
  for (size_t j = i; reinterpret_cast<uintptr_t>(pieces[j].host) + pieces[j].bytes < h + bytes;
       ++j) {
    if (static_cast<char*>(pieces[j].device) + pieces[j].bytes != pieces[j + 1].device) {
      return GpuStatus::InvalidArgument(
          "MapHost: range spans registration pieces that are not contiguous on the device");
    }
  }
  if (GpuStatus s = MapHostImpl(host, bytes); !s.ok()) return s;
  *device = static_cast<char*>(first.device) + (h - reinterpret_cast<uintptr_t>(first.host));
  return GpuStatus::Ok();
}

GpuStatus Runtime::LaunchKvCopy(const KvLayerCopy& copy, Stream& stream) {
  if (GpuStatus s = CheckStream(stream); !s.ok()) return s;
  internal::KvCopyParams params;
  if (GpuStatus s = internal::BuildKvCopyParams(copy, &params); !s.ok()) return s;
  if (params.num_chunks == 0) return GpuStatus::Ok();
  return LaunchKvCopyImpl(params, stream.native_handle());
}

GpuStatus Runtime::LaunchMemset(void* dst, uint8_t value, size_t bytes, Stream& stream) {
  if (GpuStatus s = CheckStream(stream); !s.ok()) return s;
  if (bytes == 0) return GpuStatus::Ok();
  if (dst == nullptr) return GpuStatus::InvalidArgument("LaunchMemset: dst is null");
  return LaunchMemsetImpl(dst, value, bytes, stream.native_handle());
}

GpuStatus Runtime::EventCompletionTime(const Event& event,
                                       std::chrono::steady_clock::time_point* at) {
  if (at == nullptr) return GpuStatus::InvalidArgument("EventCompletionTime: at is null");
  if (GpuStatus s = CheckEvent(event); !s.ok()) return s;
  return EventCompletionTimeImpl(event.native_handle(), at);
}

}  // namespace kvtier::gpu
