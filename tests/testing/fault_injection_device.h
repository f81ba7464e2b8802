// FaultInjectionDevice: wraps a real BlockDevice and, once its first N writes
// (or reads) have gone through, makes the next ones fail the way a disk does:
//   kEio        the write fails with EIO and writes nothing;
//   kShortWrite the first half of the request's blocks reach the disk, then
//               the write fails (what a short io_uring completion reports);
//   kTornWrite  the write reports success but the 512 bytes from the middle
//               of the request on never reach the disk (the disk holds
//               garbage there, as after a power cut mid-write): nothing is
//               reported, only verification can tell;
//   kReadEio    reads fail with EIO (writes pass).
// HoldReads(true) makes reads wait until HoldReads(false) (a slow disk at a
// chosen moment). Syncs pass through. Tests only; never linked into production targets.
#pragma once

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>

#include "kvtier/tiers/block_device.h"

namespace kvtier::testing {

enum class Fault { kEio, kShortWrite, kTornWrite, kReadEio };

class FaultInjectionDevice final : public BlockDevice {
 public:
  // `inner` must outlive this wrapper. Writes (reads, for kReadEio) beyond the
  // first `good_ops` fail as `fault` says.
  FaultInjectionDevice(BlockDevice& inner, uint64_t good_ops, Fault fault = Fault::kEio)
      : BlockDevice(inner.bytes()), inner_(inner), fault_(fault), good_left_(good_ops) {}

  void set_good_writes(uint64_t n) { good_left_.store(n); }

  // With `pass_first`, that many reads still go through before the hold starts.
  void HoldReads(bool hold, int pass_first = 0) {
    {
      std::lock_guard lock(hold_mu_);
      hold_reads_ = hold;
      pass_before_hold_ = pass_first;
    }
    hold_cv_.notify_all();
  }
  // Reads waiting in HoldReads now.
  int reads_held() const {
    std::lock_guard lock(hold_mu_);
    return reads_held_;
  }

 protected:
  Status SubmitImpl(std::span<const IoRequest> batch) override {
    for (const IoRequest& r : batch) {
      if (r.op == IoRequest::Op::kRead) {
        std::unique_lock lock(hold_mu_);
        if (hold_reads_ && pass_before_hold_ > 0) {
          --pass_before_hold_;
        } else {
          ++reads_held_;
          hold_cv_.wait(lock, [&] { return !hold_reads_; });
          --reads_held_;
        }
      }
      const bool faulted_op = (r.op == IoRequest::Op::kRead) == (fault_ == Fault::kReadEio);
      if (faulted_op && !TakeGood()) {
        switch (fault_) {
          case Fault::kEio:
          case Fault::kReadEio:
            return Status::FromErrno(EIO, "injected I/O fault");
          case Fault::kShortWrite: {
            const size_t half = r.buffer.size() / kBlockBytes / 2 * kBlockBytes;
            if (half > 0) {
              const IoRequest part{r.op, r.offset, r.buffer.subspan(0, half)};
              KVTIER_RETURN_IF_ERROR(inner_.Submit(std::span<const IoRequest>(&part, 1)));
            }
            return Status::IOError("injected short write: " + std::to_string(half) + " of " +
                                   std::to_string(r.buffer.size()) + " bytes");
          }
          case Fault::kTornWrite: {
            std::unique_ptr<std::byte, decltype(&std::free)> copy(
                static_cast<std::byte*>(std::aligned_alloc(kBlockBytes, r.buffer.size())),
                &std::free);
            std::memcpy(copy.get(), r.buffer.data(), r.buffer.size());
            std::memset(copy.get() + r.buffer.size() / 2, 0xEE, 512);
            const IoRequest torn{r.op, r.offset, {copy.get(), r.buffer.size()}};
            KVTIER_RETURN_IF_ERROR(inner_.Submit(std::span<const IoRequest>(&torn, 1)));
            continue;  // reported as written
          }
        }
      }
      KVTIER_RETURN_IF_ERROR(inner_.Submit(std::span<const IoRequest>(&r, 1)));
    }
    return Status::Ok();
  }
  Status SyncImpl() override { return inner_.Sync(); }

 private:
  // Whether one more operation may still go through untouched.
  bool TakeGood() {
    uint64_t left = good_left_.load();
    while (left > 0 && !good_left_.compare_exchange_weak(left, left - 1)) {
    }
    return left > 0;
  }

  BlockDevice& inner_;
  const Fault fault_;
  std::atomic<uint64_t> good_left_;
  mutable std::mutex hold_mu_;
  std::condition_variable hold_cv_;
  bool hold_reads_ = false;
  int pass_before_hold_ = 0;
  int reads_held_ = 0;
};

}  // namespace kvtier::testing
