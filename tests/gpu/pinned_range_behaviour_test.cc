// Pinned registration behaviour every backend must show (part of the runtime behaviour
// suite: instantiated for the host backend by runtime_test.cc, for CUDA by
// cuda_runtime_test.cc).

#include <cstdint>
#include <cstring>
#include <vector>

#include "kv_test_support.h"
#include "kvtier/gpu/pinned_range.h"
#include "runtime_test_support.h"

namespace kvtier::gpu::testing {
namespace {

TEST_P(RuntimeBehaviourTest, RegisterHostSplitsIntoPiecesAtPageBoundaries) {
  const size_t bytes = 5 * 65536 + 1000;
  HostMemory memory(bytes + 4096);
  uint8_t* start = memory.data() + 100;  // Not page-aligned: the first piece is shorter.
  PinOptions options;
  options.max_piece_bytes = 65536;
  PinnedRange range;
  KVTIER_ASSERT_GPU_OK(runtime_->RegisterHost(start, bytes, options, &range));
  EXPECT_EQ(range.data(), start);
  EXPECT_EQ(range.size_bytes(), bytes);
  ASSERT_EQ(range.pieces().size(), 6u);
  uintptr_t at = reinterpret_cast<uintptr_t>(start);
  for (size_t i = 0; i < range.pieces().size(); ++i) {
    const PinnedPiece& piece = range.pieces()[i];
    EXPECT_EQ(reinterpret_cast<uintptr_t>(piece.host), at) << "piece " << i;
    EXPECT_LE(piece.bytes, options.max_piece_bytes);
    EXPECT_NE(piece.device, nullptr);
    at += piece.bytes;
    if (i + 1 < range.pieces().size()) {
      EXPECT_EQ(at % 4096, 0u) << "piece " << i << " end";
    }
  }
  EXPECT_EQ(at, reinterpret_cast<uintptr_t>(start) + bytes);

  // A second registration of the same memory is refused; after Reset it is accepted.
  PinnedRange again;
  EXPECT_FALSE(runtime_->RegisterHost(start + 4096, 4096, PinOptions(), &again).ok());
  EXPECT_TRUE(again.empty());
  range.Reset();
  EXPECT_TRUE(range.empty());
  KVTIER_ASSERT_GPU_OK(runtime_->RegisterHost(start, bytes, PinOptions(), &again));
  EXPECT_EQ(again.pieces().size(), 1u);
}

TEST_P(RuntimeBehaviourTest, RegisterHostRejectsBadArguments) {
  HostMemory memory(8192);
  PinnedRange range;
  PinOptions odd;
  odd.max_piece_bytes = 5000;
  EXPECT_EQ(runtime_->RegisterHost(memory.data(), 8192, odd, &range).code(),
            GpuCode::kInvalidArgument);
  PinOptions huge;
  huge.max_piece_bytes = (size_t{64} << 30) + 4096;
  EXPECT_EQ(runtime_->RegisterHost(memory.data(), 8192, huge, &range).code(),
            GpuCode::kInvalidArgument);
  EXPECT_EQ(runtime_->RegisterHost(nullptr, 8192, PinOptions(), &range).code(),
            GpuCode::kInvalidArgument);
  EXPECT_EQ(runtime_->RegisterHost(memory.data(), 0, PinOptions(), &range).code(),
            GpuCode::kInvalidArgument);
  EXPECT_TRUE(range.empty());
}

TEST_P(RuntimeBehaviourTest, MappedHostMemoryIsReachableByDeviceCopies) {
  const size_t bytes = 3 * 4096;
  HostMemory memory(bytes);
  std::memset(memory.data(), 0, bytes);
  PinOptions options;
  options.max_piece_bytes = 4096;
  PinnedRange range;
  KVTIER_ASSERT_GPU_OK(runtime_->RegisterHost(memory.data(), bytes, options, &range));
  void* device = nullptr;
  EXPECT_EQ(runtime_->MapHost(range, memory.data() + bytes - 8, 16, &device).code(),
            GpuCode::kInvalidArgument)
      << "past the end";
  EXPECT_EQ(device, nullptr);
  KVTIER_ASSERT_GPU_OK(runtime_->MapHost(range, memory.data() + 100, 8000, &device));
  ASSERT_NE(device, nullptr);

  // A fill written through the mapped address lands in the host memory.
  Stream stream;
  KVTIER_ASSERT_GPU_OK(runtime_->CreateStream(&stream));
  KVTIER_ASSERT_GPU_OK(runtime_->LaunchFill(device, 8000, 5, stream));
  KVTIER_ASSERT_GPU_OK(runtime_->Synchronize(stream));
  EXPECT_EQ(std::vector<uint8_t>(memory.data() + 100, memory.data() + 8100),
            ReferencePattern(5, 8000));
  EXPECT_EQ(memory.data()[99], 0);
  EXPECT_EQ(memory.data()[8100], 0);
}

}  // namespace
}  // namespace kvtier::gpu::testing
