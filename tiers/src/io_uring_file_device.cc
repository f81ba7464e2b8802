#include "kvtier/tiers/io_uring_file_device.h"

#include <fcntl.h>
#include <liburing.h>
#include <linux/magic.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

namespace kvtier {

// Registered buffer pieces, sorted by address; each is at most kMaxFixedBytes.
struct IoUringFileDevice::BufferTable {
  uint64_t generation = 0;  // 0: nothing registered
  std::vector<iovec> pieces;
  uint64_t bytes = 0;

  // Index of the piece that holds all of [p, p + n), or -1.
  int Find(const std::byte* p, size_t n) const {
    auto it =
        std::upper_bound(pieces.begin(), pieces.end(), p, [](const std::byte* q, const iovec& v) {
          return q < static_cast<const std::byte*>(v.iov_base);
        });
    if (it == pieces.begin()) return -1;
    --it;
    const auto* base = static_cast<const std::byte*>(it->iov_base);
    if (p + n > base + it->iov_len) return -1;
    return static_cast<int>(it - pieces.begin());
  }
};

// One io_uring, owned by one thread (the one that created it).
class IoUringFileDevice::Ring {
 public:
  static Result<std::unique_ptr<Ring>> Create(uint32_t depth, int fd) {
    auto r = std::unique_ptr<Ring>(new Ring());
    // Completions run when this thread next enters the kernel, not by
    // interrupting it (5.19+); older kernels take the plain setup.
    int ret = io_uring_queue_init(depth, &r->ring_,
                                  IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG);
    if (ret == -EINVAL) ret = io_uring_queue_init(depth, &r->ring_, 0);
    if (ret < 0) return Status::FromErrno(-ret, "io_uring_queue_init");
    r->ready_ = true;
    // The file at index 0 saves a file reference per I/O; optional.
    r->fixed_file_ = io_uring_register_files(&r->ring_, &fd, 1) == 0;
    return r;
  }
  ~Ring() {
    if (ready_) io_uring_queue_exit(&ring_);
  }
  io_uring* get() { return &ring_; }
  bool fixed_file() const { return fixed_file_; }

  // Makes `table` this ring's registered buffers (if it is not already).
  // Returns -errno from the kernel; on error the ring has none.
  int UseBuffers(const BufferTable* table) {
    const uint64_t gen = table ? table->generation : 0;
    if (gen == generation_) return 0;
    if (has_buffers_) io_uring_unregister_buffers(&ring_);
    has_buffers_ = false;
    generation_ = gen;
    if (table == nullptr || table->pieces.empty()) return 0;
    const int ret = io_uring_register_buffers(&ring_, table->pieces.data(),
                                              static_cast<unsigned>(table->pieces.size()));
    has_buffers_ = ret == 0;
    return ret;
  }
  bool has_buffers() const { return has_buffers_; }
  // The ring's state is unknown (waiting for completions failed): the thread
  // gets a new ring on its next request.
  void Poison() { poisoned_ = true; }
  bool poisoned() const { return poisoned_; }

 private:
  Ring() = default;
  bool poisoned_ = false;
  io_uring ring_{};
  bool ready_ = false;
  bool fixed_file_ = false;
  bool has_buffers_ = false;
  uint64_t generation_ = 0;
};

namespace {

constexpr uint64_t kMaxFixedBytes = uint64_t{1} << 30;  // the kernel's limit per fixed buffer
// user_data of a request turned into a no-op after a submit error: never a batch index.
constexpr uint64_t kNopTag = UINT64_MAX;

uint64_t ThisThreadToken() {
  static std::atomic<uint64_t> next{1};
  thread_local const uint64_t token = next.fetch_add(1, std::memory_order_relaxed);
  return token;
}

std::atomic<uint64_t> g_buffer_generation{1};

}  // namespace

IoUringFileDevice::IoUringFileDevice(const IoUringFileOptions& options, int fd)
    : BlockDevice(options.bytes), options_(options), fd_(fd) {}

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
  // tmpfs takes O_DIRECT on recent kernels, but it is RAM: gone at reboot,
  // and taken from the memory the DRAM tier and the engine need.
  if (struct statfs fs_info{};
      statfs(dir.c_str(), &fs_info) == 0 && static_cast<uint64_t>(fs_info.f_type) == TMPFS_MAGIC) {
    return Status::InvalidArgument("NVMe path " + dir.string() +
                                   " is on tmpfs (RAM, lost at reboot); put the NVMe tier on a "
                                   "disk, or give --nvme-bytes 0 for DRAM only");
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
  // One owner per slot file: a second daemon, or the same path given twice,
  // would overwrite the first one's images.
  // A daemon that just died may hold it a moment longer: the kernel drops its
  // rings' references to the file asynchronously. Retry for up to 2 s.
  int locked = -1;
  for (int attempt = 0; attempt < 20; ++attempt) {
    locked = flock(fd, LOCK_EX | LOCK_NB);
    if (locked == 0 || errno != EWOULDBLOCK) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (locked != 0) {
    const int err = errno;
    close(fd);
    if (err == EWOULDBLOCK) {
      return Status::InvalidArgument("NVMe slot file " + o.path +
                                     " is in use (by another kvtierd, or its path is given twice)");
    }
    return Status::FromErrno(err, "flock " + o.path);
  }
  if (existed && static_cast<uint64_t>(st.st_size) > o.bytes) {
    // Its index may hold chunks past o.bytes: opening it smaller would drop them for good.
    close(fd);
    return Status::InvalidArgument(
        "NVMe slot file " + o.path + " is " + std::to_string(st.st_size) +
        " bytes, larger than the " + std::to_string(o.bytes) +
        " asked for (--nvme-bytes); the chunks past that would be lost: give --nvme-bytes " +
        std::to_string(st.st_size) +
        " or more, or remove the path's kvtier-slots.dat and index "
        "to start a smaller tier");
  }
  const int ret = posix_fallocate(fd, 0, static_cast<off_t>(o.bytes));
  if (ret != 0) {
    close(fd);
    if (!existed) unlink(o.path.c_str());
    return Status::FromErrno(ret, "fallocate " + o.path + " to " + std::to_string(o.bytes));
  }
  return std::unique_ptr<IoUringFileDevice>(new IoUringFileDevice(o, fd));
}

IoUringFileDevice::~IoUringFileDevice() {
  rings_.clear();  // unregisters buffers and the file before it closes
  // Unlocked explicitly: a ring's reference to the file is dropped by the
  // kernel later, asynchronously, and would keep the lock held meanwhile.
  flock(fd_, LOCK_UN);
  close(fd_);
}

uint64_t IoUringFileDevice::registered_buffer_bytes() const {
  std::lock_guard lock(mu_);
  return buffers_ ? buffers_->bytes : 0;
}

Result<IoUringFileDevice::Ring*> IoUringFileDevice::ThreadRing(
    std::shared_ptr<const BufferTable>* table) {
  Ring* ring = nullptr;
  {
    std::lock_guard lock(mu_);
    auto& slot = rings_[ThisThreadToken()];
    if (slot && slot->poisoned()) slot.reset();
    if (!slot) {
      auto created = Ring::Create(options_.queue_depth, fd_);
      if (!created.ok()) {
        rings_.erase(ThisThreadToken());
        return created.status();
      }
      slot = std::move(created).value();
    }
    ring = slot.get();
    *table = buffers_;
  }
  // Registration runs on the owning thread, outside mu_ (it pins pages).
  if (const int ret = ring->UseBuffers(table->get()); ret < 0) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true)) {
      spdlog::warn(
          "io_uring: registering {} bytes of buffers failed ({}); I/O pins pages per "
          "request instead",
          (*table)->bytes, std::strerror(-ret));
    }
  }
  return ring;
}

Status IoUringFileDevice::SubmitImpl(std::span<const IoRequest> batch) {
  return SubmitStreamingImpl(batch, nullptr);
}

Status IoUringFileDevice::SubmitStreamingImpl(std::span<const IoRequest> batch,
                                              const IoCompletionFn& on_complete) {
  std::shared_ptr<const BufferTable> table;
  auto ring_or = ThreadRing(&table);
  if (!ring_or.ok()) return ring_or.status();
  Ring& r = **ring_or;
  io_uring* ring = r.get();
  const BufferTable* fixed = r.has_buffers() ? table.get() : nullptr;
  const int fd = r.fixed_file() ? 0 : fd_;
  size_t next = 0, in_flight = 0;
  Status first_error;
  std::vector<size_t> done;
  // Queues requests up to the depth (none after an error; what is in flight drains).
  const auto fill = [&] {
    while (first_error.ok() && next < batch.size() && in_flight < options_.queue_depth) {
      io_uring_sqe* sqe = io_uring_get_sqe(ring);
      if (sqe == nullptr) break;
      const IoRequest& q = batch[next];
      auto* buf = q.buffer.data();
      const auto len = static_cast<unsigned>(q.buffer.size());
      const int index = fixed ? fixed->Find(buf, q.buffer.size()) : -1;
      if (q.op == IoRequest::Op::kRead) {
        if (index >= 0) {
          io_uring_prep_read_fixed(sqe, fd, buf, len, q.offset, index);
        } else {
          io_uring_prep_read(sqe, fd, buf, len, q.offset);
        }
      } else {
        if (index >= 0) {
          io_uring_prep_write_fixed(sqe, fd, buf, len, q.offset, index);
        } else {
          io_uring_prep_write(sqe, fd, buf, len, q.offset);
        }
      }
      if (r.fixed_file()) sqe->flags |= IOSQE_FIXED_FILE;
      io_uring_sqe_set_data64(sqe, next);
      ++next;
      ++in_flight;
    }
  };
  const auto submit = [&](unsigned wait_nr) {
    return options_.submit_and_wait ? options_.submit_and_wait(ring, wait_nr)
                                    : io_uring_submit_and_wait(ring, wait_nr);
  };
  // No-ops an earlier batch's submit error left queued (see abandon below) go
  // first, so that they take no room from this batch; their completions are
  // skipped like any kNopTag one.
  if (io_uring_sq_ready(ring) > 0) {
    if (const int ret = submit(0); ret < 0) {
      return Status::FromErrno(-ret, "io_uring_submit_and_wait (an earlier batch's no-ops)");
    }
  }
  // A submit error must not return with I/O in flight: the kernel would still
  // read into or write from buffers the caller has freed, and the completions
  // would land in the next batch. Requests the kernel never took become no-ops
  // (their completions, tagged kNopTag, are skipped by every batch), and the
  // ones it took are waited for.
  const auto abandon = [&](int err, const char* call) {
    if (first_error.ok()) first_error = Status::FromErrno(err, call);
    const unsigned queued = io_uring_sq_ready(ring);
    for (unsigned k = 0; k < queued; ++k) {
      io_uring_sqe* sqe = &ring->sq.sqes[(ring->sq.sqe_tail - 1 - k) & ring->sq.ring_mask];
      io_uring_prep_nop(sqe);
      io_uring_sqe_set_data64(sqe, kNopTag);
    }
    in_flight -= queued;
  };
  for (;;) {
    fill();
    if (in_flight == 0) break;
    int ret = first_error.ok() ? submit(1) : 0;
    if (ret < 0 && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY) {
      abandon(-ret, "io_uring_submit_and_wait");
      if (in_flight == 0) break;
    }
    io_uring_cqe* cqe;
    ret = io_uring_wait_cqe(ring, &cqe);
    if (ret < 0 && ret != -EINTR) {
      // Cannot happen with a ring in use; should it, the ring is not reused.
      r.Poison();
      return Status::FromErrno(-ret, "io_uring_wait_cqe");
    }
    unsigned head, seen = 0, counted = 0;
    done.clear();
    io_uring_for_each_cqe(ring, head, cqe) {
      ++seen;
      const uint64_t i = io_uring_cqe_get_data64(cqe);
      if (i == kNopTag) continue;  // a request an earlier submit error left behind
      ++counted;
      const IoRequest& q = batch[i];
      const char* what = q.op == IoRequest::Op::kRead ? "read" : "write";
      if (cqe->res < 0) {
        if (first_error.ok()) {
          first_error = Status::FromErrno(-cqe->res, std::string(what) + " " + options_.path +
                                                         " at " + std::to_string(q.offset));
        }
      } else if (static_cast<uint64_t>(cqe->res) != q.buffer.size()) {
        if (first_error.ok()) {
          first_error =
              Status::IOError("short " + std::string(what) + " of " + options_.path + " at " +
                              std::to_string(q.offset) + ": " + std::to_string(cqe->res) + " of " +
                              std::to_string(q.buffer.size()) + " bytes");
        }
      } else {
        done.push_back(i);
      }
    }
    io_uring_cq_advance(ring, seen);
    in_flight -= counted;
    if (on_complete && !done.empty()) {
      // Refill the queue first, so the device stays busy while the caller
      // works on what completed.
      fill();
      if (io_uring_sq_ready(ring) > 0) {
        ret = io_uring_submit(ring);
        if (ret < 0 && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY) {
          abandon(-ret, "io_uring_submit");
        }
      }
      for (size_t i : done) on_complete(i);
    }
  }
  return first_error;
}

Status IoUringFileDevice::RegisterBuffersImpl(std::span<const std::span<std::byte>> regions) {
  auto table = std::make_shared<BufferTable>();
  table->generation = g_buffer_generation.fetch_add(1, std::memory_order_relaxed);
  for (std::span<std::byte> region : regions) {
    for (uint64_t off = 0; off < region.size(); off += kMaxFixedBytes) {
      const uint64_t n = std::min<uint64_t>(kMaxFixedBytes, region.size() - off);
      table->pieces.push_back({region.data() + off, n});
      table->bytes += n;
    }
  }
  std::sort(table->pieces.begin(), table->pieces.end(),
            [](const iovec& a, const iovec& b) { return a.iov_base < b.iov_base; });
  for (size_t i = 1; i < table->pieces.size(); ++i) {
    const auto* prev = static_cast<const std::byte*>(table->pieces[i - 1].iov_base);
    if (prev + table->pieces[i - 1].iov_len > table->pieces[i].iov_base) {
      return Status::InvalidArgument("registered buffer regions overlap");
    }
  }
  if (table->pieces.empty()) table.reset();
  {
    std::lock_guard lock(mu_);
    buffers_ = table;
  }
  // Register with this thread's ring now, so that a refusal is reported here.
  std::shared_ptr<const BufferTable> seen;
  auto ring = ThreadRing(&seen);
  if (!ring.ok()) return ring.status();
  if (table && !(*ring)->has_buffers()) {
    {
      std::lock_guard lock(mu_);
      buffers_.reset();
    }
    (void)ThreadRing(&seen);  // unregister from this ring too (nothing was)
    return Status::ResourceExhausted(
        "io_uring refused to register " + std::to_string(table->bytes) +
        " bytes of buffers (RLIMIT_MEMLOCK?); I/O pins pages per request instead");
  }
  return Status::Ok();
}

Status IoUringFileDevice::SyncImpl() {
  if (fdatasync(fd_) != 0) return Status::FromErrno(errno, "fdatasync " + options_.path);
  return Status::Ok();
}

}  // namespace kvtier
