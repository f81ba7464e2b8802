// Unit tests of the gpu runtime on the host-emulation backend (no GPU needed), plus the
// host-only contracts: completion timestamps, stream teardown, CreateCuda without a GPU.

#include "kvtier/gpu/runtime.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <vector>

#include "runtime_test_support.h"

namespace kvtier::gpu::testing {
namespace {

using Clock = std::chrono::steady_clock;

INSTANTIATE_TEST_SUITE_P(Host, RuntimeBehaviourTest, ::testing::Values(Backend::kHost),
                         BackendName);

TEST(HostRuntime, NamesItsBackend) {
  std::unique_ptr<Runtime> runtime = Runtime::CreateHost();
  ASSERT_NE(runtime, nullptr);
  EXPECT_EQ(runtime->backend(), Backend::kHost);
  EXPECT_EQ(runtime->name(), "host");
}

TEST(HostRuntime, WrappingAnExternalStreamIsUnsupportedAndLeavesOutAlone) {
  std::unique_ptr<Runtime> runtime = Runtime::CreateHost();
  Stream out;
  KVTIER_ASSERT_GPU_OK(runtime->CreateStream(&out));
  void* before = out.native_handle();
  int dummy = 0;
  const GpuStatus s = runtime->WrapExternalStream(&dummy, &out);
  EXPECT_EQ(s.code(), GpuCode::kUnsupported);
  EXPECT_NE(s.message().find("host"), std::string::npos) << s.ToString();
  EXPECT_EQ(out.native_handle(), before);
  EXPECT_EQ(runtime->WrapExternalStream(&dummy, nullptr).code(), GpuCode::kInvalidArgument);
}

TEST(HostRuntime, EventCompletionTimeExistsOnlyOnceTheRecordFired) {
  std::unique_ptr<Runtime> runtime = Runtime::CreateHost();
  Stream stream;
  Event event;
  KVTIER_ASSERT_GPU_OK(runtime->CreateStream(&stream));
  KVTIER_ASSERT_GPU_OK(runtime->CreateEvent(&event));
  Clock::time_point at;
  EXPECT_EQ(runtime->EventCompletionTime(event, &at).code(), GpuCode::kInvalidArgument);

  Gate gate;
  KVTIER_ASSERT_GPU_OK(runtime->LaunchHostFunc(stream, gate.Waiter()));
  KVTIER_ASSERT_GPU_OK(runtime->RecordEvent(event, stream));
  EXPECT_EQ(runtime->EventCompletionTime(event, &at).code(), GpuCode::kInvalidArgument);

  const Clock::time_point opened_at = gate.Open();
  KVTIER_ASSERT_GPU_OK(runtime->SynchronizeEvent(event));
  KVTIER_ASSERT_GPU_OK(runtime->EventCompletionTime(event, &at));
  EXPECT_GE(at, opened_at);
  EXPECT_LE(at, Clock::now());
}

TEST(HostRuntime, EventRefersToItsLatestRecord) {
  std::unique_ptr<Runtime> runtime = Runtime::CreateHost();
  Stream free_stream, held_stream;
  Event event;
  KVTIER_ASSERT_GPU_OK(runtime->CreateStream(&free_stream));
  KVTIER_ASSERT_GPU_OK(runtime->CreateStream(&held_stream));
  KVTIER_ASSERT_GPU_OK(runtime->CreateEvent(&event));
  KVTIER_ASSERT_GPU_OK(runtime->RecordEvent(event, free_stream));
  KVTIER_ASSERT_GPU_OK(runtime->SynchronizeEvent(event));

  Gate gate;
  KVTIER_ASSERT_GPU_OK(runtime->LaunchHostFunc(held_stream, gate.Waiter()));
  KVTIER_ASSERT_GPU_OK(runtime->RecordEvent(event, held_stream));
  bool complete = true;
  KVTIER_ASSERT_GPU_OK(runtime->QueryEvent(event, &complete));
  EXPECT_FALSE(complete) << "query saw the earlier, fired record";
  gate.Open();
  KVTIER_ASSERT_GPU_OK(runtime->SynchronizeEvent(event));
  KVTIER_ASSERT_GPU_OK(runtime->QueryEvent(event, &complete));
  EXPECT_TRUE(complete);
}

TEST(HostRuntime, DestroyingAStreamRunsItsQueuedWorkFirst) {
  std::unique_ptr<Runtime> runtime = Runtime::CreateHost();
  const size_t bytes = 1 << 16;
  DeviceBuffer buffer;
  KVTIER_ASSERT_GPU_OK(runtime->Allocate(bytes, &buffer));
  Stream stream;
  KVTIER_ASSERT_GPU_OK(runtime->CreateStream(&stream));
  KVTIER_ASSERT_GPU_OK(runtime->LaunchFill(buffer.data(), bytes, 99, stream));
  stream.Reset();
  EXPECT_FALSE(stream.valid());
  const auto* data = static_cast<const uint8_t*>(buffer.data());
  EXPECT_EQ(std::vector<uint8_t>(data, data + bytes), ReferencePattern(99, bytes));
}

TEST(HostRuntime, HandlesMoveOwnership) {
  std::unique_ptr<Runtime> runtime = Runtime::CreateHost();
  DeviceBuffer a;
  KVTIER_ASSERT_GPU_OK(runtime->Allocate(512, &a));
  void* data = a.data();
  DeviceBuffer b = std::move(a);
  EXPECT_TRUE(a.empty());  // NOLINT(bugprone-use-after-move): moved-from is empty.
  EXPECT_EQ(b.data(), data);
  EXPECT_EQ(b.size_bytes(), 512u);
  b.Reset();
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(b.runtime(), nullptr);
}

TEST(HostRuntimeDeathTest, DestroyingTheRuntimeBeforeItsHandlesAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  std::unique_ptr<Runtime> runtime = Runtime::CreateHost();
  DeviceBuffer buffer;
  KVTIER_ASSERT_GPU_OK(runtime->Allocate(64, &buffer));
  EXPECT_DEATH(runtime.reset(), "destroyed while 1 of its buffers, streams or events");
}

TEST(CudaRuntime, CreateWithoutGpuReturnsAnErrorNotACrash) {
  std::unique_ptr<Runtime> runtime;
  EXPECT_EQ(Runtime::CreateCuda(0, nullptr).code(), GpuCode::kInvalidArgument);
  EXPECT_FALSE(Runtime::CreateCuda(-1, &runtime).ok());
  EXPECT_EQ(runtime, nullptr);

  const GpuStatus s = Runtime::CreateCuda(0, &runtime);
  if (s.ok()) GTEST_SKIP() << "a GPU is present; gpu_cuda_test covers the CUDA backend";
  EXPECT_EQ(s.code(), GpuCode::kUnavailable) << s.ToString();
  EXPECT_FALSE(s.message().empty());
  EXPECT_EQ(runtime, nullptr);
}

TEST(GpuStatus, PrintsCodeAndMessage) {
  EXPECT_TRUE(GpuStatus().ok());
  EXPECT_EQ(GpuStatus::Ok().ToString(), "OK");
  const GpuStatus s = GpuStatus::OutOfMemory("cudaMalloc(64 bytes)");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), GpuCode::kOutOfMemory);
  EXPECT_EQ(s.ToString(), "OUT_OF_MEMORY: cudaMalloc(64 bytes)");
}

}  // namespace
}  // namespace kvtier::gpu::testing
