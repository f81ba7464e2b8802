// BufferCache on the host backend: buffers given back are lent again instead of
// allocated, within the idle cap, and a lent buffer is never lent twice.
#include "kvtier/gpu/buffer_cache.h"

#include <gtest/gtest.h>

#include <memory>

#include "kvtier/gpu/runtime.h"
#include "runtime_test_support.h"

namespace kvtier::gpu::testing {
namespace {

TEST(BufferCache, AGivenBackBufferIsLentAgainAndRoundsUpToAPowerOfTwo) {
  std::unique_ptr<Runtime> runtime = Runtime::CreateHost();
  BufferCache cache(*runtime);
  ScratchBuffer a;
  KVTIER_ASSERT_GPU_OK(cache.Take(5000, &a));
  EXPECT_EQ(a.size_bytes(), 8192u);
  void* first = a.data();
  ScratchBuffer b;
  KVTIER_ASSERT_GPU_OK(cache.Take(5000, &b));
  EXPECT_NE(b.data(), first) << "a lent buffer was lent twice";
  a.Reset();
  EXPECT_EQ(cache.idle_bytes(), 8192u);
  ScratchBuffer c;
  KVTIER_ASSERT_GPU_OK(cache.Take(6000, &c));
  EXPECT_EQ(c.data(), first) << "the idle buffer was not reused";
  EXPECT_EQ(cache.idle_bytes(), 0u);
}

TEST(BufferCache, AnIdleBufferMoreThanTwiceTheSizeIsNotLentForASmallRequest) {
  std::unique_ptr<Runtime> runtime = Runtime::CreateHost();
  BufferCache cache(*runtime);
  ScratchBuffer big;
  KVTIER_ASSERT_GPU_OK(cache.Take(1 << 20, &big));
  void* big_data = big.data();
  big.Reset();
  ScratchBuffer small;
  KVTIER_ASSERT_GPU_OK(cache.Take(4096, &small));
  EXPECT_NE(small.data(), big_data);
  EXPECT_EQ(cache.idle_bytes(), size_t{1} << 20);
}

TEST(BufferCache, BuffersPastTheIdleCapAreFreed) {
  std::unique_ptr<Runtime> runtime = Runtime::CreateHost();
  BufferCache cache(*runtime, /*max_idle_bytes=*/12288);
  ScratchBuffer a, b;
  KVTIER_ASSERT_GPU_OK(cache.Take(8192, &a));
  KVTIER_ASSERT_GPU_OK(cache.Take(8192, &b));
  a.Reset();
  b.Reset();
  EXPECT_EQ(cache.idle_bytes(), 8192u);
}

TEST(BufferCache, BadArgumentsAreRefused) {
  std::unique_ptr<Runtime> runtime = Runtime::CreateHost();
  BufferCache cache(*runtime);
  ScratchBuffer a;
  EXPECT_EQ(cache.Take(0, &a).code(), GpuCode::kInvalidArgument);
  EXPECT_EQ(cache.Take(16, nullptr).code(), GpuCode::kInvalidArgument);
  EXPECT_EQ(a.data(), nullptr);
}

}  // namespace
}  // namespace kvtier::gpu::testing
