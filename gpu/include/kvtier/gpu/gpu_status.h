// GpuStatus: the error type of the gpu module.
//
// gpu/ builds with the CUDA toolkit alone, so it cannot use kvtier::Status from common/.
// Callers in higher layers convert a GpuStatus into their own Status at the boundary.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

namespace kvtier::gpu {

// The small, closed set of outcomes a gpu call can have. Each Runtime method lists which
// of these it can return.
enum class GpuCode : uint8_t {
  kOk = 0,
  kInvalidArgument,  // A caller error: null pointer, zero size, foreign or empty handle.
  kUnavailable,      // The backend cannot run here: built without CUDA, no driver, no GPU.
  kUnsupported,      // The backend does not offer this operation.
  kOutOfMemory,      // Device (or, for the host backend, host) memory is exhausted.
  kDeviceError,      // The CUDA runtime reported an error, possibly from earlier async work.
  kInternal,         // A bug or an OS resource failure (e.g. a thread could not start).
};

// Returns "OK", "INVALID_ARGUMENT", ... for logs and test messages.
std::string_view GpuCodeName(GpuCode code);

// A code plus a human-readable message. Cheap to copy when OK (empty message).
// Thread-safety: a value type; distinct objects may be used from distinct threads.
class [[nodiscard]] GpuStatus {
 public:
  GpuStatus() = default;  // OK.

  static GpuStatus Ok() { return GpuStatus(); }
  static GpuStatus InvalidArgument(std::string msg) {
    return GpuStatus(GpuCode::kInvalidArgument, std::move(msg));
  }
  static GpuStatus Unavailable(std::string msg) {
    return GpuStatus(GpuCode::kUnavailable, std::move(msg));
  }
  static GpuStatus Unsupported(std::string msg) {
    return GpuStatus(GpuCode::kUnsupported, std::move(msg));
  }
  static GpuStatus OutOfMemory(std::string msg) {
    return GpuStatus(GpuCode::kOutOfMemory, std::move(msg));
  }
  static GpuStatus DeviceError(std::string msg) {
    return GpuStatus(GpuCode::kDeviceError, std::move(msg));
  }
  static GpuStatus Internal(std::string msg) {
    return GpuStatus(GpuCode::kInternal, std::move(msg));
  }

  bool ok() const { return code_ == GpuCode::kOk; }
  GpuCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "OK" or "CODE_NAME: message".
  std::string ToString() const;

 private:
  GpuStatus(GpuCode code, std::string msg) : code_(code), message_(std::move(msg)) {}

  GpuCode code_ = GpuCode::kOk;
  std::string message_;
};

}  // namespace kvtier::gpu
