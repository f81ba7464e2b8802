// IoUringFileDevice: a BlockDevice on one preallocated file, opened O_DIRECT,
// driven by io_uring. Each calling thread gets its own ring on this device
// (created on first use, kept until the device closes), so several I/O workers
// submit at once without sharing a queue. The file is registered with every
// ring; buffers registered with RegisterBuffers are registered with every ring
// as each thread next submits, in pieces of at most 1 GiB (the kernel's limit
// per fixed buffer), and requests that lie inside one piece use
// IORING_OP_READ_FIXED/WRITE_FIXED (no per-I/O page pinning).
//
// Thread-safety: thread-safe (see BlockDevice); mu_ guards the ring map and
// the buffer table, never held during I/O.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "kvtier/tiers/block_device.h"

struct io_uring;

namespace kvtier {

struct IoUringFileOptions {
  // The file; created when missing. Its directory must exist. Default: "".
  std::string path;
  // File size in bytes, a multiple of 4096; preallocated with fallocate.
  // Default: 0 (must be set).
  uint64_t bytes = 0;
  // Requests in flight per ring. Range 1..4096. Default: 32.
  uint32_t queue_depth = 32;
  // Submits the ring's queued requests and waits for `wait_nr` completions:
  // io_uring_submit_and_wait when empty. Tests wrap it to inject submit errors.
  std::function<int(io_uring* ring, unsigned wait_nr)> submit_and_wait;
};

class IoUringFileDevice final : public BlockDevice {
 public:
  // Opens (creating and preallocating as needed) the file. Nothing is left
  // behind on error. Errors: INVALID_ARGUMENT naming the problem: a size that
  // is zero or not a multiple of 4096, a directory that is missing or not a
  // directory, too little free space for the file (statvfs), a file system
  // that refuses O_DIRECT (tmpfs, for one); IO_ERROR from open/fallocate.
  static Result<std::unique_ptr<IoUringFileDevice>> Open(const IoUringFileOptions& options);
  ~IoUringFileDevice() override;

  const std::string& path() const { return options_.path; }

  // Bytes registered as fixed buffers (0 when none). For tests and benchmarks.
  uint64_t registered_buffer_bytes() const;

 protected:
  Status SubmitImpl(std::span<const IoRequest> batch) override;
  Status SubmitStreamingImpl(std::span<const IoRequest> batch,
                             const IoCompletionFn& on_complete) override;
  Status SyncImpl() override;
  Status RegisterBuffersImpl(std::span<const std::span<std::byte>> regions) override;

 private:
  class Ring;
  struct BufferTable;
  IoUringFileDevice(const IoUringFileOptions& options, int fd);
  // The calling thread's ring, created on first use, with `table` registered
  // when the kernel allows it. Never returns null on OK.
  Result<Ring*> ThreadRing(std::shared_ptr<const BufferTable>* table);

  const IoUringFileOptions options_;
  const int fd_;

  mutable std::mutex mu_;
  // Keyed by a per-thread number that is never reused (a std::thread::id can
  // be, and a ring must stay with the thread that created it).
  std::unordered_map<uint64_t, std::unique_ptr<Ring>> rings_;  // GUARDED_BY(mu_)
  std::shared_ptr<const BufferTable> buffers_;                 // GUARDED_BY(mu_)
};

}  // namespace kvtier
