#include "kvtier/daemon/nvme_health.h"

#include <spdlog/spdlog.h>

#include <string>

namespace kvtier {

void NvmeHealth::NoteIo(bool ok) {
  const bool was_degraded = Degraded();
  if (ok) {
    failure_streak_ = 0;
  } else {
    ++io_errors_;
    ++failure_streak_;
  }
  if (was_degraded == Degraded()) return;
  if (was_degraded) {
    spdlog::info("NVMe tier: I/O succeeds again; no longer degraded");
  } else if (const std::string why = nvme_.write_failure(); !why.empty()) {
    spdlog::error(
        "NVMe tier degraded until kvtierd restarts: its index takes no more writes "
        "({}); DRAM keeps serving, NVMe chunks are still read",
        why);
  } else {
    spdlog::error("NVMe tier degraded: {} I/O batches failed in a row; DRAM keeps serving",
                  kDegradedAfter);
  }
}

void NvmeHealth::NoteWrite(const Status& status, const char* what, size_t chunks) {
  NoteIo(status.ok());
  if (status.ok() == !writes_failing_) return;
  writes_failing_ = !status.ok();
  if (writes_failing_) {  // once per run of failures: io_errors counts each batch
    spdlog::warn(
        "NVMe {} of {} chunks failed: {}; later failures are counted in io_errors{}", what, chunks,
        status.ToString(),
        nvme_.write_failure().empty() ? "" : "; the tier is degraded until kvtierd restarts");
  } else {
    spdlog::info("NVMe writes succeed again");
  }
}

bool NvmeHealth::Degraded() const {
  return failure_streak_ >= kDegradedAfter || !nvme_.write_failure().empty();
}

}  // namespace kvtier
