#include "kvtier/tiers/io_uring_file_device.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace kvtier {
namespace {

// One io_uring, owned by one thread.
class Ring {
 public:
  static Result<std::unique_ptr<Ring>> Create(uint32_t depth) {
    auto r = std::unique_ptr<Ring>(new Ring(depth));
    const int ret = io_uring_queue_init(depth, &r->ring_, 0);
    if (ret < 0) return Status::FromErrno(-ret, "io_uring_queue_init");
    r->ready_ = true;
    return r;
  }
  ~Ring() {
    if (ready_) io_uring_queue_exit(&ring_);
  }
  io_uring* get() { return &ring_; }
  uint32_t depth() const { return depth_; }

 private:
  explicit Ring(uint32_t depth) : depth_(depth) {}
  io_uring ring_{};
  uint32_t depth_;
  bool ready_ = false;
};

Result<Ring*> ThreadRing(uint32_t depth) {
  thread_local std::unique_ptr<Ring> ring;
  if (!ring || ring->depth() < depth) {
    auto created = Ring::Create(depth);
    if (!created.ok()) return created.status();
    ring = std::move(created).value();
  }
  return ring.get();
}

}  // namespace

Result<std::unique_ptr<IoUringFileDevice>> IoUringFileDevice::Open(const IoUringFileOptions& o) {
  namespace fs = std::filesystem;
  if (o.bytes == 0 || o.bytes % kBlockBytes != 0) {
    return Status::InvalidArgument("NVMe file size " + std::to_string(o.bytes) +
                                   " is not a positive multiple of 4096");
  }
  if (o.queue_depth < 1 || o.queue_depth > 4096) {
    return Status::InvalidArgument("queue_depth " + std::to_string(o.queue_depth) +
                                   " is outside 1..4096");
  }
  const fs::path file(o.path);
  const fs::path dir = file.has_parent_path() ? file.parent_path() : fs::path(".");
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    return Status::InvalidArgument("NVMe path " + dir.string() + " does not exist");
  }
  if (!fs::is_directory(dir, ec)) {
    return Status::InvalidArgument("NVMe path " + dir.string() + " is not a directory");
  }
  struct stat st {};
  const bool existed = stat(o.path.c_str(), &st) == 0;
  const uint64_t have = existed ? static_cast<uint64_t>(st.st_blocks) * 512 : 0;
  struct statvfs vfs {};
  if (statvfs(dir.c_str(), &vfs) != 0) return Status::FromErrno(errno, "statvfs " + dir.string());
  const uint64_t free_bytes = uint64_t{vfs.f_bavail} * vfs.f_frsize;
  if (o.bytes > have && o.bytes - have > free_bytes) {
    return Status::InvalidArgument("NVMe path " + dir.string() + " has " +
                                   std::to_string(free_bytes) + " bytes free, fewer than the " +
                                   std::to_string(o.bytes - have) + " more that " + o.path +
                                   " needs");
  }
  const int fd = open(o.path.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int err = errno;
    if (err == EINVAL) {
      return Status::InvalidArgument("the file system of " + dir.string() +
                                     " refuses O_DIRECT (tmpfs?); put the NVMe tier on a disk");
    }
    return Status::FromErrno(err, "open " + o.path);
  }
  const int ret = posix_fallocate(fd, 0, static_cast<off_t>(o.bytes));
  if (ret != 0) {
    close(fd);
    if (!existed) unlink(o.path.c_str());
    return Status::FromErrno(ret, "fallocate " + o.path + " to " + std::to_string(o.bytes));
  }
  return std::unique_ptr<IoUringFileDevice>(new IoUringFileDevice(o, fd));
}

IoUringFileDevice::~IoUringFileDevice() { close(fd_); }

Status IoUringFileDevice::SubmitImpl(std::span<const IoRequest> batch) {
  auto ring_or = ThreadRing(options_.queue_depth);
  if (!ring_or.ok()) return ring_or.status();
  io_uring* ring = (*ring_or)->get();
  size_t next = 0, in_flight = 0;
  Status first_error;
  while (next < batch.size() || in_flight > 0) {
    // Fill the queue (stop submitting after an error; drain what is in flight).
    while (first_error.ok() && next < batch.size() && in_flight < options_.queue_depth) {
      io_uring_sqe* sqe = io_uring_get_sqe(ring);
      if (sqe == nullptr) break;
      const IoRequest& r = batch[next];
      if (r.op == IoRequest::Op::kRead) {
        io_uring_prep_read(sqe, fd_, r.buffer.data(), static_cast<unsigned>(r.buffer.size()),
                           r.offset);
      } else {
        io_uring_prep_write(sqe, fd_, r.buffer.data(), static_cast<unsigned>(r.buffer.size()),
                            r.offset);
      }
      io_uring_sqe_set_data64(sqe, next);
      ++next;
      ++in_flight;
    }
    if (in_flight == 0) break;
    int ret = io_uring_submit_and_wait(ring, 1);
    if (ret < 0 && ret != -EINTR) return Status::FromErrno(-ret, "io_uring_submit_and_wait");
    io_uring_cqe* cqe;
    unsigned head, seen = 0;
    io_uring_for_each_cqe(ring, head, cqe) {
      ++seen;
      const IoRequest& r = batch[io_uring_cqe_get_data64(cqe)];
      const char* what = r.op == IoRequest::Op::kRead ? "read" : "write";
      if (first_error.ok()) {
        if (cqe->res < 0) {
          first_error = Status::FromErrno(-cqe->res, std::string(what) + " " + options_.path +
                                                         " at " + std::to_string(r.offset));
        } else if (static_cast<uint64_t>(cqe->res) != r.buffer.size()) {
          first_error = Status::IOError("short " + std::string(what) + " of " + options_.path +
                                        " at " + std::to_string(r.offset) + ": " +
                                        std::to_string(cqe->res) + " of " +
                                        std::to_string(r.buffer.size()) + " bytes");
        }
      }
    }
    io_uring_cq_advance(ring, seen);
    in_flight -= seen;
  }
  return first_error;
}

Status IoUringFileDevice::SyncImpl() {
  if (fdatasync(fd_) != 0) return Status::FromErrno(errno, "fdatasync " + options_.path);
  return Status::Ok();
}

}  // namespace kvtier
