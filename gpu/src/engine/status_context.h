// Error plumbing private to gpu/src/engine: a GpuStatus with "what: " before its message,
// and early returns.
#pragma once

#include <string>
#include <string_view>
#include <utility>

#include "kvtier/gpu/gpu_status.h"

namespace kvtier::gpu::engine::internal {

// `s` with the same code and the message "what: <message>"; OK stays OK.
inline GpuStatus WithContext(GpuStatus s, std::string_view what) {
  if (s.ok()) return s;
  std::string msg(what);
  msg += ": ";
  msg += s.message();
  switch (s.code()) {
    case GpuCode::kInvalidArgument:
      return GpuStatus::InvalidArgument(std::move(msg));
    case GpuCode::kUnavailable:
      return GpuStatus::Unavailable(std::move(msg));
    case GpuCode::kUnsupported:
      return GpuStatus::Unsupported(std::move(msg));
    case GpuCode::kOutOfMemory:
      return GpuStatus::OutOfMemory(std::move(msg));
    case GpuCode::kDeviceError:
      return GpuStatus::DeviceError(std::move(msg));
    case GpuCode::kOk:
    case GpuCode::kInternal:
      break;
  }
  return GpuStatus::Internal(std::move(msg));
}

}  // namespace kvtier::gpu::engine::internal

// Returns the status of `expr` from the enclosing function unless it is OK.
#define KVTIER_ENGINE_RETURN_IF_ERROR(expr)                             \
  do {                                                                  \
    if (::kvtier::gpu::GpuStatus _kvtier_s = (expr); !_kvtier_s.ok()) { \
      return _kvtier_s;                                                 \
    }                                                                   \
  } while (0)
