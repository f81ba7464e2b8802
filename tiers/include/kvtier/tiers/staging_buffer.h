// StagingBuffer: one page-aligned heap region, kept and reused for the copies of slot images
// on their way to the NVMe tier. A fresh allocation per image (glibc maps anything that
// large anew) paid its page faults on every copy: about half of the write time of 4 MiB
// images (kvtier-bench nvme). The region grows to the largest batch asked for and stays
// (the NVMe writer's batches are at most 64 MiB, or 1/16 of the arena, and one slot).
//
// Thread-safety: not thread-safe; one writer uses it at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>

namespace kvtier {

class StagingBuffer {
 public:
  // A region of at least `bytes` (rounded up to 4096), aligned to 4096, valid until the next
  // call. Its contents are not kept when it has to grow. Throws std::bad_alloc.
  std::byte* Reserve(uint64_t bytes) {
    const uint64_t rounded = (bytes + 4095) & ~uint64_t{4095};
    if (rounded > capacity_) {
      region_.reset();  // the old one goes first: the peak is one region
      capacity_ = 0;
      void* p = std::aligned_alloc(4096, rounded);
      if (p == nullptr) throw std::bad_alloc();
      region_.reset(static_cast<std::byte*>(p));
      capacity_ = rounded;
    }
    return region_.get();
  }
  uint64_t capacity_bytes() const { return capacity_; }

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> region_;
  uint64_t capacity_ = 0;
};

}  // namespace kvtier
