// PinnedRange: RAII registration (page-locking and device mapping) of a host memory range.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace kvtier::gpu {

class Runtime;

// Options of Runtime::RegisterHost.
struct PinOptions {
  // Largest single registration. Recent NVIDIA drivers reject one cudaHostRegister larger
  // than 64 GiB, so a range is registered in pieces of at most this many bytes, split at
  // 4 KiB-aligned addresses. Must be a multiple of 4096 in [4096, 64 GiB]. Smaller values
  // exist for tests. Default: 64 GiB.
  size_t max_piece_bytes = size_t{64} << 30;
};

// One registered piece: [host, host + bytes) is reachable by device code at [device, ..).
struct PinnedPiece {
  void* host = nullptr;
  void* device = nullptr;
  size_t bytes = 0;
};

// A host range registered with a Runtime (CUDA: cudaHostRegister(Mapped | Portable) per
// piece; host backend: bookkeeping only). Unregistered on destruction or Reset(). Does not
// own the memory itself. REQUIRES: the memory outlives the registration, no queued work
// still uses it when it is unregistered, and the Runtime outlives it.
// Thread-safety: not thread-safe (move/Reset); const accessors may be called concurrently.
class PinnedRange {
 public:
  PinnedRange() = default;  // Empty.
  ~PinnedRange() { Reset(); }
  PinnedRange(PinnedRange&& other) noexcept;
  PinnedRange& operator=(PinnedRange&& other) noexcept;
  PinnedRange(const PinnedRange&) = delete;
  PinnedRange& operator=(const PinnedRange&) = delete;

  bool empty() const { return pieces_.empty(); }
  void* data() const { return empty() ? nullptr : pieces_.front().host; }
  size_t size_bytes() const { return size_bytes_; }
  // In address order; consecutive pieces are adjacent in host memory.
  const std::vector<PinnedPiece>& pieces() const { return pieces_; }
  Runtime* runtime() const { return owner_; }
  // Whether [host, host + bytes) lies inside the range.
  bool Contains(const void* host, size_t bytes) const;

  // Unregisters every piece now and leaves the handle empty.
  void Reset();

 private:
  friend class Runtime;
  PinnedRange(Runtime* owner, std::vector<PinnedPiece> pieces, size_t size_bytes)
      : owner_(owner), pieces_(std::move(pieces)), size_bytes_(size_bytes) {}

  Runtime* owner_ = nullptr;
  std::vector<PinnedPiece> pieces_;
  size_t size_bytes_ = 0;
};

}  // namespace kvtier::gpu
