// IoUringFileDevice: a BlockDevice on one preallocated file, opened O_DIRECT,
// driven by io_uring. Each calling thread gets its own ring (created on first
// use), so several I/O workers submit at once without sharing a queue.
#pragma once

#include <memory>
#include <string>

#include "kvtier/tiers/block_device.h"

namespace kvtier {

struct IoUringFileOptions {
  // The file; created when missing. Its directory must exist. Default: "".
  std::string path;
  // File size in bytes, a multiple of 4096; preallocated with fallocate.
  // Default: 0 (must be set).
  uint64_t bytes = 0;
  // Requests in flight per ring. Range 1..4096. Default: 32.
  uint32_t queue_depth = 32;
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

 protected:
  Status SubmitImpl(std::span<const IoRequest> batch) override;
  Status SyncImpl() override;

 private:
  IoUringFileDevice(const IoUringFileOptions& options, int fd)
      : BlockDevice(options.bytes), options_(options), fd_(fd) {}

  const IoUringFileOptions options_;
  const int fd_;
};

}  // namespace kvtier
