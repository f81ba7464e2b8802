#include "host_runtime.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <iterator>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <utility>

#include "fill_pattern.h"
#include "host_ipc_handle.h"
#include "kv_copy_params.h"

namespace kvtier::gpu {
namespace {

using Clock = std::chrono::steady_clock;

// One record of an event: fires once, remembering when. Thread-safe.
class Completion {
 public:
  void Fire() {
    std::lock_guard<std::mutex> lock(mu_);
    fired_at_ = Clock::now();
    done_ = true;
    cv_.notify_all();
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return done_; });
  }
  // Returns whether it fired; if so and `at` is non-null, sets *at to when.
  bool Done(Clock::time_point* at) {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_ && at != nullptr) *at = fired_at_;
    return done_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;           // GUARDED_BY(mu_)
  Clock::time_point fired_at_;  // GUARDED_BY(mu_)
};

// An event: the latest record, or none. Thread-safe.
class HostEvent {
 public:
  std::shared_ptr<Completion> Latest() {
    std::lock_guard<std::mutex> lock(mu_);
    return latest_;
  }
  std::shared_ptr<Completion> NewRecord() {
    auto record = std::make_shared<Completion>();
    std::lock_guard<std::mutex> lock(mu_);
    latest_ = record;
    return record;
  }

 private:
  std::mutex mu_;
  std::shared_ptr<Completion> latest_;  // GUARDED_BY(mu_); null until first recorded.
};

// A worker thread running queued operations in order. Enqueue is thread-safe; the
// destructor runs what is queued, then joins. Throws std::system_error if the thread
// cannot start.
class HostStream {
 public:
  HostStream() : worker_([this] { Run(); }) {}
  ~HostStream() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_one();
    worker_.join();
  }

  void Enqueue(std::function<void()> op) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(op));
    }
    cv_.notify_one();
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping_ and drained.
      std::function<void()> op = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      op();
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;  // GUARDED_BY(mu_)
  bool stopping_ = false;                    // GUARDED_BY(mu_)
  std::thread worker_;                       // Last: starts after the fields above exist.
};

HostStream* AsStream(void* handle) { return static_cast<HostStream*>(handle); }
HostEvent* AsEvent(void* handle) { return static_cast<HostEvent*>(handle); }

constexpr std::align_val_t kAlign{Runtime::kDeviceAlignmentBytes};

// An OS call of AllocateExported failing with `err`: out of memory where the kernel says
// so (the host backend's "device memory" is the machine's), kDeviceError otherwise.
GpuStatus FromErrno(int err, const std::string& what) {
  std::string msg = "host backend: " + what + ": " + std::strerror(err);
  if (err == ENOMEM || err == ENOSPC || err == EFBIG) return GpuStatus::OutOfMemory(std::move(msg));
  return GpuStatus::DeviceError(std::move(msg));
}

}  // namespace

GpuStatus HostRuntime::AllocateImpl(size_t bytes, DeviceBuffer* out) {
  void* data = ::operator new(bytes, kAlign, std::nothrow);
  if (data == nullptr) {
    return GpuStatus::OutOfMemory("host backend: cannot allocate " + std::to_string(bytes) +
                                  " bytes");
  }
  *out = WrapBuffer(data, bytes);
  return GpuStatus::Ok();
}

void HostRuntime::FreeImpl(void* data) noexcept {
  Mapping mapping;
  {
    std::lock_guard<std::mutex> lock(mappings_mu_);
    auto it = mappings_.find(data);
    if (it == mappings_.end()) {
      ::operator delete(data, kAlign);
      return;
    }
    mapping = it->second;
    mappings_.erase(it);
  }
  ::munmap(data, mapping.bytes);
  if (mapping.fd >= 0) ::close(mapping.fd);  // Openers' mappings keep the pages alive.
}

GpuStatus HostRuntime::AllocateExportedImpl(size_t bytes, DeviceBuffer* out,
                                            std::string* ipc_handle) {
  // fallocate below commits the pages now, as cudaMalloc does, so that running out is
  // kOutOfMemory here instead of SIGBUS at the first touch of a page. A memfd has no size
  // limit of its own, so more than the machine's memory is refused before fallocate would
  // drive it into the OOM killer.
  const auto physical = static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) *
                        static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  if (bytes > physical || bytes > static_cast<size_t>(INT64_MAX)) {
    return GpuStatus::OutOfMemory("host backend: AllocateExported: " + std::to_string(bytes) +
                                  " bytes is more than the machine's " + std::to_string(physical) +
                                  " bytes of memory");
  }
  const int fd = ::memfd_create("kvtier-exported", MFD_CLOEXEC);
  if (fd < 0) return FromErrno(errno, "memfd_create");
  const auto length = static_cast<off_t>(bytes);
  if (::ftruncate(fd, length) != 0 || ::fallocate(fd, 0, 0, length) != 0) {
    const int err = errno;
    ::close(fd);
    return FromErrno(err, "sizing a memfd to " + std::to_string(bytes) + " bytes");
  }
  void* data = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    const int err = errno;
    ::close(fd);
    return FromErrno(err, "mmap of " + std::to_string(bytes) + " exported bytes");
  }
  // mmap returns whole pages: Runtime::kDeviceAlignmentBytes holds.
  {
    std::lock_guard<std::mutex> lock(mappings_mu_);
    mappings_[data] = Mapping{bytes, fd};
  }
  *ipc_handle = internal::HostIpcHandle{::getpid(), fd, bytes}.Format();
  *out = WrapBuffer(data, bytes);
  return GpuStatus::Ok();
}

GpuStatus HostRuntime::OpenExportedImpl(std::string_view ipc_handle, size_t bytes,
                                        DeviceBuffer* out) {
  const std::string who = "host backend: OpenExported: ";
  if (!ipc_handle.starts_with(internal::kHostIpcPrefix)) {
    if (ipc_handle.size() == internal::kCudaIpcHandleBytes) {
      return GpuStatus::InvalidArgument(
          who +
          "the handle is not a host-backend handle but 64 bytes without the \"host-ipc:\" "
          "prefix, a CUDA IPC handle: the exporter runs the CUDA backend");
    }
    return GpuStatus::InvalidArgument(who + "malformed handle (" +
                                      std::to_string(ipc_handle.size()) +
                                      " bytes without the \"host-ipc:\" prefix)");
  }
  internal::HostIpcHandle handle;
  if (GpuStatus s = internal::HostIpcHandle::Parse(ipc_handle, &handle); !s.ok()) {
    return GpuStatus::InvalidArgument(who + s.message());
  }
  if (bytes > handle.bytes) {
    return GpuStatus::InvalidArgument(who + "bytes " + std::to_string(bytes) +
                                      " is larger than the exported size " +
                                      std::to_string(handle.bytes));
  }
  const std::string path =
      "/proc/" + std::to_string(handle.pid) + "/fd/" + std::to_string(handle.fd);
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    std::string msg = who + "cannot open " + path + ": " + std::strerror(err);
    // ENOENT: the exporter exited or freed the memory; EACCES/EPERM: it runs as another
    // user (the /proc link needs ptrace read access to it).
    if (err == ENOENT || err == ESRCH || err == EACCES || err == EPERM) {
      return GpuStatus::Unavailable(std::move(msg) +
                                    " (the exporter exited, freed the memory or runs as another "
                                    "user)");
    }
    return GpuStatus::DeviceError(std::move(msg));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<uint64_t>(st.st_size) != handle.bytes) {
    ::close(fd);
    // The fd number was reused: the export it named is gone.
    return GpuStatus::Unavailable(who + path + " is no longer the exported memory of " +
                                  std::to_string(handle.bytes) + " bytes");
  }
  void* data = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);  // The mapping keeps the memory; only the exporter keeps its fd open.
  if (data == MAP_FAILED) {
    return GpuStatus::DeviceError(who + "mmap of " + std::to_string(bytes) + " bytes of " + path +
                                  ": " + std::strerror(err));
  }
  {
    std::lock_guard<std::mutex> lock(mappings_mu_);
    mappings_[data] = Mapping{bytes, -1};
  }
  *out = WrapBuffer(data, bytes);
  return GpuStatus::Ok();
}

GpuStatus HostRuntime::CreateStreamImpl(Stream* out) {
  try {
    *out = WrapStream(new HostStream());
  } catch (const std::exception& e) {
    return GpuStatus::Internal(std::string("host backend: cannot start stream thread: ") +
                               e.what());
  }
  return GpuStatus::Ok();
}

void HostRuntime::DestroyStreamImpl(void* handle) noexcept { delete AsStream(handle); }

GpuStatus HostRuntime::CreateEventImpl(Event* out) {
  *out = WrapEvent(new HostEvent());
  return GpuStatus::Ok();
}

void HostRuntime::DestroyEventImpl(void* handle) noexcept { delete AsEvent(handle); }

GpuStatus HostRuntime::CheckFault(const void* ptr, size_t bytes, const char* what) const {
  if (options_.inject_fault && options_.inject_fault(ptr, bytes)) {
    return GpuStatus::DeviceError(std::string("host backend: injected fault in ") + what);
  }
  return GpuStatus::Ok();
}

GpuStatus HostRuntime::CopyAsyncImpl(void* dst, const void* src, size_t bytes, void* stream) {
  if (GpuStatus s = CheckFault(src, bytes, "CopyAsync source"); !s.ok()) return s;
  if (GpuStatus s = CheckFault(dst, bytes, "CopyAsync destination"); !s.ok()) return s;
  AsStream(stream)->Enqueue([dst, src, bytes] { std::memcpy(dst, src, bytes); });
  return GpuStatus::Ok();
}

GpuStatus HostRuntime::LaunchFillImpl(void* dst, size_t bytes, uint64_t seed, void* stream) {
  AsStream(stream)->Enqueue([dst, bytes, seed] {
    auto* out = static_cast<unsigned char*>(dst);
    for (size_t word = 0; word * 8 < bytes; ++word) {
      const uint64_t value = internal::FillPatternWord(seed, word);
      const size_t n = bytes - word * 8 < 8 ? bytes - word * 8 : 8;
      for (size_t b = 0; b < n; ++b) {
        out[word * 8 + b] = static_cast<unsigned char>(value >> (8 * b));
      }
    }
  });
  return GpuStatus::Ok();
}

GpuStatus HostRuntime::LaunchHostFuncImpl(void* stream, std::function<void()> fn) {
  AsStream(stream)->Enqueue(std::move(fn));
  return GpuStatus::Ok();
}

GpuStatus HostRuntime::RecordEventImpl(void* event, void* stream) {
  std::shared_ptr<Completion> record = AsEvent(event)->NewRecord();
  AsStream(stream)->Enqueue([record] { record->Fire(); });
  return GpuStatus::Ok();
}

GpuStatus HostRuntime::QueryEventImpl(void* event, bool* complete) {
  std::shared_ptr<Completion> record = AsEvent(event)->Latest();
  *complete = record == nullptr || record->Done(nullptr);
  return GpuStatus::Ok();
}

GpuStatus HostRuntime::SynchronizeEventImpl(void* event) {
  if (std::shared_ptr<Completion> record = AsEvent(event)->Latest()) record->Wait();
  return GpuStatus::Ok();
}

GpuStatus HostRuntime::StreamWaitEventImpl(void* stream, void* event) {
  std::shared_ptr<Completion> record = AsEvent(event)->Latest();
  if (record != nullptr) AsStream(stream)->Enqueue([record] { record->Wait(); });
  return GpuStatus::Ok();
}

GpuStatus HostRuntime::SynchronizeImpl(void* stream) {
  auto marker = std::make_shared<Completion>();
  AsStream(stream)->Enqueue([marker] { marker->Fire(); });
  marker->Wait();
  return GpuStatus::Ok();
}

GpuStatus HostRuntime::EventCompletionTimeImpl(void* event, Clock::time_point* at) {
  std::shared_ptr<Completion> record = AsEvent(event)->Latest();
  if (record == nullptr) return GpuStatus::InvalidArgument("event was never recorded");
  if (!record->Done(at)) return GpuStatus::InvalidArgument("event has not completed yet");
  return GpuStatus::Ok();
}

GpuStatus HostRuntime::RegisterHostPieceImpl(void* host, size_t bytes, void** device) {
  const auto start = reinterpret_cast<uintptr_t>(host);
  const uintptr_t end = start + bytes;
  std::lock_guard<std::mutex> lock(registered_mu_);
  auto next = registered_.lower_bound(start);
  const bool overlaps_next = next != registered_.end() && next->first < end;
  const bool overlaps_prev = next != registered_.begin() && std::prev(next)->second > start;
  if (overlaps_next || overlaps_prev) {
    return GpuStatus::InvalidArgument("host backend: range is already registered");
  }
  registered_.emplace(start, end);
  *device = host;
  return GpuStatus::Ok();
}

void HostRuntime::UnregisterHostPieceImpl(void* host) noexcept {
  std::lock_guard<std::mutex> lock(registered_mu_);
  registered_.erase(reinterpret_cast<uintptr_t>(host));
}

GpuStatus HostRuntime::MapHostImpl(const void* host, size_t bytes) {
  return CheckFault(host, bytes, "MapHost");
}

GpuStatus HostRuntime::LaunchKvCopyImpl(const internal::KvCopyParams& params, void* stream) {
  AsStream(stream)->Enqueue([params] { internal::RunKvCopyOnHost(params); });
  return GpuStatus::Ok();
}

GpuStatus HostRuntime::LaunchMemsetImpl(void* dst, uint8_t value, size_t bytes, void* stream) {
  AsStream(stream)->Enqueue([dst, value, bytes] { std::memset(dst, value, bytes); });
  return GpuStatus::Ok();
}

}  // namespace kvtier::gpu
