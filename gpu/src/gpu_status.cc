#include "kvtier/gpu/gpu_status.h"

namespace kvtier::gpu {

std::string_view GpuCodeName(GpuCode code) {
  switch (code) {
    case GpuCode::kOk:
      return "OK";
    case GpuCode::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case GpuCode::kUnavailable:
      return "UNAVAILABLE";
    case GpuCode::kUnsupported:
      return "UNSUPPORTED";
    case GpuCode::kOutOfMemory:
      return "OUT_OF_MEMORY";
    case GpuCode::kDeviceError:
      return "DEVICE_ERROR";
    case GpuCode::kInternal:
      return "INTERNAL";
  }
  return "UNKNOWN";
}

std::string GpuStatus::ToString() const {
  if (ok()) return "OK";
  std::string out(GpuCodeName(code_));
  out += ": ";
  out += message_;
  return out;
}

}  // namespace kvtier::gpu
