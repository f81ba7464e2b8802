// Arena: the shared-memory DRAM arena (a sealed memfd) and its mappings.
//
// The daemon creates the arena with Create(); it is sealed against shrinking
// and growing, so a client cannot make the daemon fault with SIGBUS. Clients
// receive the fd over the Unix socket (SCM_RIGHTS, see fd_passing.h) and map it
// with Map(). An Arena owns its fd and its mapping (RAII).
//
// Thread-safety: immutable after construction; the bytes it maps are shared and
// their use is coordinated by slot ownership (reservations and leases).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "kvtier/status.h"

namespace kvtier {

class Arena {
 public:
  // Creates a sealed memfd arena of `bytes` (a multiple of 4 KiB) and maps it.
  // `epoch` is a nonzero id that changes whenever a daemon creates an arena.
  // Errors: INVALID_ARGUMENT for a bad size, IO_ERROR from memfd_create,
  // ftruncate, fcntl or mmap.
  static Result<std::unique_ptr<Arena>> Create(uint64_t bytes, uint64_t epoch);

  // Maps an arena received from a daemon; takes ownership of `fd`. Checks that
  // the fd is at least `bytes` long and a memfd sealed against shrinking and
  // growing (a file that shrinks under the mapping would SIGBUS its readers).
  // Errors: INVALID_ARGUMENT naming what is wrong, IO_ERROR.
  static Result<std::unique_ptr<Arena>> Map(int fd, uint64_t bytes, uint64_t epoch);

  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  std::byte* base() const { return base_; }
  uint64_t bytes() const { return bytes_; }
  uint64_t epoch() const { return epoch_; }
  int fd() const { return fd_; }

  // True when [offset, offset + len) lies inside the arena.
  bool Contains(uint64_t offset, uint64_t len) const {
    return offset <= bytes_ && len <= bytes_ - offset;
  }

 private:
  Arena(int fd, std::byte* base, uint64_t bytes, uint64_t epoch)
      : fd_(fd), base_(base), bytes_(bytes), epoch_(epoch) {}

  int fd_;
  std::byte* base_;
  uint64_t bytes_;
  uint64_t epoch_;
};

}  // namespace kvtier
