// HostIpcHandle: the host backend's handle of exported memory, and the constants by which
// each backend tells the other's handles apart. Private to gpu/.
#pragma once

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>

#include "kvtier/gpu/gpu_status.h"

namespace kvtier::gpu::internal {

// Every host-backend handle starts with this. A CUDA handle is kCudaIpcHandleBytes opaque
// bytes (a cudaIpcMemHandle_t) that never starts with it.
inline constexpr std::string_view kHostIpcPrefix = "host-ipc:";
// sizeof(cudaIpcMemHandle_t) (CUDA_IPC_HANDLE_SIZE); cuda_backend.cc asserts it.
inline constexpr size_t kCudaIpcHandleBytes = 64;

// What a host-backend handle names: a memfd of the exporting process, which an opener
// reaches as /proc/<pid>/fd/<fd>. Text form: "host-ipc:v1:<pid>:<fd>:<bytes>", decimal.
struct HostIpcHandle {
  int64_t pid = 0;   // The exporting process (> 0).
  int fd = -1;       // Its memfd (>= 0).
  size_t bytes = 0;  // The exported size in bytes (> 0).

  std::string Format() const {
    return std::string(kHostIpcPrefix) + "v1:" + std::to_string(pid) + ":" + std::to_string(fd) +
           ":" + std::to_string(bytes);
  }

  // Parses Format's text into *out. Errors: kInvalidArgument naming what is wrong (no
  // prefix, another version, a missing, non-decimal or out-of-range field, trailing text).
  static GpuStatus Parse(std::string_view text, HostIpcHandle* out) {
    auto bad = [](const std::string& what) {
      return GpuStatus::InvalidArgument("malformed host-backend IPC handle: " + what);
    };
    if (!text.starts_with(kHostIpcPrefix)) return bad("no \"host-ipc:\" prefix");
    text.remove_prefix(kHostIpcPrefix.size());
    if (!text.starts_with("v1:")) return bad("version is not v1");
    text.remove_prefix(3);
    HostIpcHandle h;
    // Each field: decimal digits, then ':' (or the end, for the last one).
    auto field = [&text](auto* value, bool last) {
      const char* end = text.data() + text.size();
      const auto [ptr, ec] = std::from_chars(text.data(), end, *value);
      if (ec != std::errc() || ptr == text.data()) return false;
      text.remove_prefix(static_cast<size_t>(ptr - text.data()));
      if (last) return text.empty();
      if (!text.starts_with(':')) return false;
      text.remove_prefix(1);
      return true;
    };
    if (!field(&h.pid, false) || h.pid <= 0) return bad("pid is not a positive number");
    if (!field(&h.fd, false) || h.fd < 0) return bad("fd is not a non-negative number");
    if (!field(&h.bytes, true) || h.bytes == 0) {
      return bad("bytes is not a positive number (or text follows it)");
    }
    *out = h;
    return GpuStatus::Ok();
  }
};

}  // namespace kvtier::gpu::internal
