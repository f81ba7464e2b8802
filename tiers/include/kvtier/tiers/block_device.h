// BlockDevice: where the NVMe tier's slot images live (CacheLib Navy's Device).
//
// The public calls are non-virtual: they check alignment and bounds and keep
// the counters, then call the protected *Impl of the implementation
// (IoUringFileDevice; tests wrap a real device to inject faults, see
// tests/testing/fault_injection_device.h). Every buffer, offset and length is a
// multiple of kBlockBytes (O_DIRECT).
//
// A caller whose buffers come from a few long-lived regions (the DRAM arena)
// registers them once (RegisterBuffers); an implementation may then skip
// pinning their pages on every I/O (io_uring fixed buffers).
//
// Thread-safety: implementations are thread-safe; Submit may be called from
// several I/O workers at once.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>

#include "kvtier/status.h"

namespace kvtier {

inline constexpr uint64_t kBlockBytes = 4096;

struct IoRequest {
  enum class Op { kRead, kWrite };
  Op op = Op::kRead;
  uint64_t offset = 0;          // bytes from the start of the device
  std::span<std::byte> buffer;  // kBlockBytes-aligned address and length
};

struct BlockDeviceCounters {
  std::atomic<uint64_t> reads{0};
  std::atomic<uint64_t> writes{0};
  std::atomic<uint64_t> read_bytes{0};
  std::atomic<uint64_t> write_bytes{0};
  std::atomic<uint64_t> errors{0};
};

// Called on the submitting thread with the index (in its batch) of a request
// that completed in full, while later requests of the batch may still be in
// flight (so a reader can verify one image while the next ones are read).
using IoCompletionFn = std::function<void(size_t index)>;

class BlockDevice {
 public:
  virtual ~BlockDevice() = default;

  // Runs every request of `batch` (in any order, up to the queue depth at a
  // time) and returns when all completed. `on_complete`, when set, is called
  // once for each request that completed in full, in completion order, before
  // Submit returns (after a failure it may not be called for the rest).
  // Errors: INVALID_ARGUMENT for a misaligned or out-of-range request (nothing
  // runs); IO_ERROR naming the first failed request (others may have run; a
  // short read or write is an error).
  Status Submit(std::span<const IoRequest> batch, const IoCompletionFn& on_complete = nullptr);

  // Registers the memory that later I/O buffers come from, e.g. the DRAM
  // arena: requests whose buffer lies inside one region may then run without
  // pinning its pages on every I/O (io_uring fixed buffers). Replaces any
  // earlier registration; an empty span unregisters. Other buffers keep
  // working as before. The regions must stay mapped, at the same addresses,
  // until they are unregistered or the device is destroyed, and no Submit may
  // be running while registering. Errors: INVALID_ARGUMENT for an empty
  // region; RESOURCE_EXHAUSTED when the kernel refuses to pin them
  // (RLIMIT_MEMLOCK): then nothing is registered and I/O still works, with
  // per-I/O pinning. Devices that have nothing to gain return OK.
  Status RegisterBuffers(std::span<const std::span<std::byte>> regions);

  // Makes completed writes durable (fdatasync). Errors: IO_ERROR.
  Status Sync();

  uint64_t bytes() const { return bytes_; }
  const BlockDeviceCounters& counters() const { return counters_; }

 protected:
  explicit BlockDevice(uint64_t bytes) : bytes_(bytes) {}
  virtual Status SubmitImpl(std::span<const IoRequest> batch) = 0;
  // Submit with a completion callback; the default runs SubmitImpl and then
  // reports every request as completed.
  virtual Status SubmitStreamingImpl(std::span<const IoRequest> batch,
                                     const IoCompletionFn& on_complete);
  virtual Status SyncImpl() = 0;
  // Default: nothing to register (OK).
  virtual Status RegisterBuffersImpl(std::span<const std::span<std::byte>> regions);

 private:
  const uint64_t bytes_;
  BlockDeviceCounters counters_;
};

}  // namespace kvtier
