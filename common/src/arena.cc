#include "kvtier/arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace kvtier {

Result<std::unique_ptr<Arena>> Arena::Create(uint64_t bytes, uint64_t epoch) {
  if (bytes == 0 || bytes % 4096 != 0) {
    return Status::InvalidArgument("arena size " + std::to_string(bytes) +
                                   " bytes is not a positive multiple of 4096");
  }
  int fd = memfd_create("kvtier-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Status::FromErrno(errno, "memfd_create");
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    Status st = Status::FromErrno(errno, "ftruncate arena to " + std::to_string(bytes));
    close(fd);
    return st;
  }
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    Status st = Status::FromErrno(errno, "fcntl(F_ADD_SEALS) on arena");
    close(fd);
    return st;
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    Status st = Status::FromErrno(errno, "mmap arena of " + std::to_string(bytes) + " bytes");
    close(fd);
    return st;
  }
  return std::unique_ptr<Arena>(new Arena(fd, static_cast<std::byte*>(p), bytes, epoch));
}

Result<std::unique_ptr<Arena>> Arena::Map(int fd, uint64_t bytes, uint64_t epoch) {
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    Status s = Status::FromErrno(errno, "fstat arena fd");
    close(fd);
    return s;
  }
  if (bytes == 0 || static_cast<uint64_t>(st.st_size) < bytes) {
    close(fd);
    return Status::InvalidArgument("arena fd holds " + std::to_string(st.st_size) +
                                   " bytes, fewer than the announced " + std::to_string(bytes));
  }
  // A file that can shrink under the mapping turns every access into a
  // possible SIGBUS: only a memfd sealed against shrinking and growing is mapped.
  const int seals = fcntl(fd, F_GET_SEALS);
  constexpr int kNeeded = F_SEAL_SHRINK | F_SEAL_GROW;
  if (seals < 0 || (seals & kNeeded) != kNeeded) {
    const int err = errno;
    close(fd);
    return Status::InvalidArgument(
        seals < 0 ? "arena fd is not a sealable memfd (" + std::string(std::strerror(err)) + ")"
                  : "arena memfd is not sealed against shrinking and growing (seals " +
                        std::to_string(seals) + ")");
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    Status s = Status::FromErrno(errno, "mmap arena");
    close(fd);
    return s;
  }
  return std::unique_ptr<Arena>(new Arena(fd, static_cast<std::byte*>(p), bytes, epoch));
}

Arena::~Arena() {
  munmap(base_, bytes_);
  close(fd_);
}

}  // namespace kvtier
