// NvmeHealth: the NVMe tier's degraded state, from the outcome of each of its
// I/O batches (promotion reads, writes, admin evictions).
//
// The tier is degraded after kDegradedAfter failed batches in a row, until one
// succeeds, and for good once its index takes no more writes (a full disk,
// until kvtierd restarts). DRAM keeps serving meanwhile; NVMe misses are
// misses. Each change is logged once.
//
// Thread-safety: none; CacheCore guards it with its mutex.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvtier/status.h"
#include "kvtier/tiers/nvme_tier.h"

namespace kvtier {

class NvmeHealth {
 public:
  static constexpr uint32_t kDegradedAfter = 3;

  // `nvme` must outlive it.
  explicit NvmeHealth(const NvmeTier& nvme) : nvme_(nvme) {}

  // Notes one I/O batch.
  void NoteIo(bool ok);
  // NoteIo for a write batch of `chunks` (`what`: "write-through",
  // "write-back"), logging when writes start failing (once) and when they
  // succeed again.
  void NoteWrite(const Status& status, const char* what, size_t chunks);
  bool Degraded() const;
  // Failed batches since the start (what stats call io_errors).
  uint64_t io_errors() const { return io_errors_; }

 private:
  const NvmeTier& nvme_;
  uint64_t io_errors_ = 0;
  uint32_t failure_streak_ = 0;
  bool writes_failing_ = false;
};

}  // namespace kvtier
