// BlockDevice: where the NVMe tier's slot images live (CacheLib Navy's Device).
//
// The public calls are non-virtual: they check alignment and bounds and keep
// the counters, then call the protected *Impl of the implementation
// (IoUringFileDevice; tests wrap a real device to inject faults, see
// tests/testing/fault_injection_device.h). Every buffer, offset and length is a
// multiple of kBlockBytes (O_DIRECT).
//
// Thread-safety: implementations are thread-safe; Submit may be called from
// several I/O workers at once.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>

#include "kvtier/status.h"

namespace kvtier {

inline constexpr uint64_t kBlockBytes = 4096;

struct IoRequest {
  enum class Op { kRead, kWrite };
  Op op = Op::kRead;
  uint64_t offset = 0;           // bytes from the start of the device
  std::span<std::byte> buffer;   // kBlockBytes-aligned address and length
};

struct BlockDeviceCounters {
  std::atomic<uint64_t> reads{0};
  std::atomic<uint64_t> writes{0};
  std::atomic<uint64_t> read_bytes{0};
  std::atomic<uint64_t> write_bytes{0};
  std::atomic<uint64_t> errors{0};
};

class BlockDevice {
 public:
  virtual ~BlockDevice() = default;

  // Runs every request of `batch` (in any order, up to the queue depth at a
  // time) and returns when all completed. Errors: INVALID_ARGUMENT for a
  // misaligned or out-of-range request (nothing runs); IO_ERROR naming the
  // first failed request (others may have run; a short read or write is an
  // error).
  Status Submit(std::span<const IoRequest> batch);

  // Makes completed writes durable (fdatasync). Errors: IO_ERROR.
  Status Sync();

  uint64_t bytes() const { return bytes_; }
  const BlockDeviceCounters& counters() const { return counters_; }

 protected:
  explicit BlockDevice(uint64_t bytes) : bytes_(bytes) {}
  virtual Status SubmitImpl(std::span<const IoRequest> batch) = 0;
  virtual Status SyncImpl() = 0;

 private:
  const uint64_t bytes_;
  BlockDeviceCounters counters_;
};

}  // namespace kvtier
