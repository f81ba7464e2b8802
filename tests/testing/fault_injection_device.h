// FaultInjectionDevice: wraps a real BlockDevice and fails writes (EIO) after
// the first N succeed, or short-writes them; reads and syncs pass through.
// Tests only; never linked into production targets.
#pragma once

#include <atomic>
#include <cerrno>

#include "kvtier/tiers/block_device.h"

namespace kvtier::testing {

class FaultInjectionDevice final : public BlockDevice {
 public:
  // `inner` must outlive this wrapper. Writes beyond the first
  // `good_writes` fail with EIO.
  FaultInjectionDevice(BlockDevice& inner, uint64_t good_writes)
      : BlockDevice(inner.bytes()), inner_(inner), good_writes_left_(good_writes) {}

  void set_good_writes(uint64_t n) { good_writes_left_.store(n); }

 protected:
  Status SubmitImpl(std::span<const IoRequest> batch) override {
    for (const IoRequest& r : batch) {
      if (r.op == IoRequest::Op::kWrite) {
        uint64_t left = good_writes_left_.load();
        while (left > 0 && !good_writes_left_.compare_exchange_weak(left, left - 1)) {
        }
        if (left == 0) return Status::FromErrno(EIO, "injected write fault");
      }
      KVTIER_RETURN_IF_ERROR(inner_.Submit(std::span<const IoRequest>(&r, 1)));
    }
    return Status::Ok();
  }
  Status SyncImpl() override { return inner_.Sync(); }

 private:
  BlockDevice& inner_;
  std::atomic<uint64_t> good_writes_left_;
};

}  // namespace kvtier::testing
