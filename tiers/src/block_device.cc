#include "kvtier/tiers/block_device.h"

#include <string>

namespace kvtier {

Status BlockDevice::Submit(std::span<const IoRequest> batch, const IoCompletionFn& on_complete) {
  for (size_t i = 0; i < batch.size(); ++i) {
    const IoRequest& r = batch[i];
    const auto addr = reinterpret_cast<uintptr_t>(r.buffer.data());
    if (r.offset % kBlockBytes != 0 || r.buffer.size() % kBlockBytes != 0 ||
        addr % kBlockBytes != 0 || r.buffer.empty()) {
      return Status::InvalidArgument("I/O request " + std::to_string(i) +
                                     ": offset, length and buffer must be non-empty multiples of "
                                     "4096 bytes");
    }
    if (r.offset > bytes_ || r.buffer.size() > bytes_ - r.offset) {
      return Status::InvalidArgument(
          "I/O request " + std::to_string(i) + ": [" + std::to_string(r.offset) + ", +" +
          std::to_string(r.buffer.size()) + ") is past the device end " + std::to_string(bytes_));
    }
  }
  Status st = on_complete ? SubmitStreamingImpl(batch, on_complete) : SubmitImpl(batch);
  if (!st.ok()) {
    counters_.errors.fetch_add(1, std::memory_order_relaxed);
    return st;
  }
  for (const IoRequest& r : batch) {
    if (r.op == IoRequest::Op::kRead) {
      counters_.reads.fetch_add(1, std::memory_order_relaxed);
      counters_.read_bytes.fetch_add(r.buffer.size(), std::memory_order_relaxed);
    } else {
      counters_.writes.fetch_add(1, std::memory_order_relaxed);
      counters_.write_bytes.fetch_add(r.buffer.size(), std::memory_order_relaxed);
    }
  }
  return Status::Ok();
}

Status BlockDevice::SubmitStreamingImpl(std::span<const IoRequest> batch,
                                        const IoCompletionFn& on_complete) {
  KVTIER_RETURN_IF_ERROR(SubmitImpl(batch));
  for (size_t i = 0; i < batch.size(); ++i) on_complete(i);
  return Status::Ok();
}

Status BlockDevice::RegisterBuffers(std::span<const std::span<std::byte>> regions) {
  for (size_t i = 0; i < regions.size(); ++i) {
    if (regions[i].empty()) {
      return Status::InvalidArgument("buffer region " + std::to_string(i) + " is empty");
    }
  }
  return RegisterBuffersImpl(regions);
}

Status BlockDevice::RegisterBuffersImpl(std::span<const std::span<std::byte>>) {
  return Status::Ok();
}

Status BlockDevice::Sync() {
  Status st = SyncImpl();
  if (!st.ok()) counters_.errors.fetch_add(1, std::memory_order_relaxed);
  return st;
}

}  // namespace kvtier
