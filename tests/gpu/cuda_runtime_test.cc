// Tests of the CUDA backend (CTest label `gpu`). Every test skips when Runtime::CreateCuda
// fails: no GPU, no driver, or built without CUDA.

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "kvtier/gpu/runtime.h"
#include "runtime_test_support.h"

namespace kvtier::gpu::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(Cuda, RuntimeBehaviourTest, ::testing::Values(Backend::kCuda),
                         BackendName);

class CudaRuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const GpuStatus s = Runtime::CreateCuda(0, &runtime_);
    if (!s.ok()) GTEST_SKIP() << "no usable GPU: " << s.ToString();
  }
  std::unique_ptr<Runtime> runtime_;
};

TEST_F(CudaRuntimeTest, NamesItsBackendAndDevice) {
  EXPECT_EQ(runtime_->backend(), Backend::kCuda);
  EXPECT_EQ(runtime_->name(), "cuda:0");
}

TEST_F(CudaRuntimeTest, OutOfRangeDeviceIsInvalidArgument) {
  std::unique_ptr<Runtime> other;
  EXPECT_EQ(Runtime::CreateCuda(1 << 20, &other).code(), GpuCode::kInvalidArgument);
  EXPECT_EQ(other, nullptr);
}

TEST_F(CudaRuntimeTest, EventCompletionTimeIsUnsupported) {
  Stream stream;
  Event event;
  KVTIER_ASSERT_GPU_OK(runtime_->CreateStream(&stream));
  KVTIER_ASSERT_GPU_OK(runtime_->CreateEvent(&event));
  KVTIER_ASSERT_GPU_OK(runtime_->RecordEvent(event, stream));
  KVTIER_ASSERT_GPU_OK(runtime_->SynchronizeEvent(event));
  std::chrono::steady_clock::time_point at;
  EXPECT_EQ(runtime_->EventCompletionTime(event, &at).code(), GpuCode::kUnsupported);
}

TEST_F(CudaRuntimeTest, ExportedMemoryHasA64ByteIpcHandle) {
  DeviceBuffer exported;
  std::string handle;
  KVTIER_ASSERT_GPU_OK(runtime_->AllocateExported(1 << 20, &exported, &handle));
  EXPECT_EQ(handle.size(), 64u) << "sizeof(cudaIpcMemHandle_t)";
  EXPECT_NE(handle.substr(0, 9), "host-ipc:");
  EXPECT_EQ(exported.size_bytes(), size_t{1} << 20);
}

TEST_F(CudaRuntimeTest, OpeningItsOwnExportIsRefusedNamingWhy) {
  DeviceBuffer exported, out;
  std::string handle;
  KVTIER_ASSERT_GPU_OK(runtime_->AllocateExported(4096, &exported, &handle));
  const GpuStatus s = runtime_->OpenExported(handle, 4096, &out);
  EXPECT_EQ(s.code(), GpuCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("exported by this runtime"), std::string::npos) << s.message();
  EXPECT_TRUE(out.empty());
  // Once freed, the handle is no longer this runtime's: CUDA itself refuses it.
  exported.Reset();
  EXPECT_FALSE(runtime_->OpenExported(handle, 4096, &out).ok());
  EXPECT_TRUE(out.empty());
}

TEST_F(CudaRuntimeTest, HandlesExposeNativeCudaHandles) {
  Stream stream;
  Event event;
  KVTIER_ASSERT_GPU_OK(runtime_->CreateStream(&stream));
  KVTIER_ASSERT_GPU_OK(runtime_->CreateEvent(&event));
  EXPECT_NE(stream.native_handle(), nullptr);
  EXPECT_NE(event.native_handle(), nullptr);
}

TEST_F(CudaRuntimeTest, AWrappedEngineStreamOrdersWorkAndIsNotDestroyedWithItsHandle) {
  Stream engine;  // stands for the engine's own stream (torch's current stream)
  KVTIER_ASSERT_GPU_OK(runtime_->CreateStream(&engine));
  DeviceBuffer a, b;
  KVTIER_ASSERT_GPU_OK(runtime_->Allocate(1 << 20, &a));
  KVTIER_ASSERT_GPU_OK(runtime_->Allocate(1 << 20, &b));
  {
    Stream wrapped;
    KVTIER_ASSERT_GPU_OK(runtime_->WrapExternalStream(engine.native_handle(), &wrapped));
    EXPECT_EQ(wrapped.native_handle(), engine.native_handle());
    KVTIER_ASSERT_GPU_OK(runtime_->LaunchFill(a.data(), 1 << 20, 99, wrapped));
    KVTIER_ASSERT_GPU_OK(runtime_->CopyAsync(b.data(), a.data(), 1 << 20, wrapped));
  }  // the handle ends; the stream must not
  std::vector<uint8_t> host(1 << 20), expected(1 << 20);
  KVTIER_ASSERT_GPU_OK(runtime_->CopyAsync(host.data(), b.data(), host.size(), engine));
  KVTIER_ASSERT_GPU_OK(runtime_->Synchronize(engine));
  KVTIER_ASSERT_GPU_OK(runtime_->LaunchFill(a.data(), 1 << 20, 99, engine));
  KVTIER_ASSERT_GPU_OK(runtime_->CopyAsync(expected.data(), a.data(), expected.size(), engine));
  KVTIER_ASSERT_GPU_OK(runtime_->Synchronize(engine));
  EXPECT_EQ(host, expected);
  Stream legacy;
  KVTIER_ASSERT_GPU_OK(runtime_->WrapExternalStream(nullptr, &legacy));
  EXPECT_TRUE(legacy.valid()) << "nullptr names the legacy default stream";
  KVTIER_ASSERT_GPU_OK(runtime_->Synchronize(legacy));
}

}  // namespace
}  // namespace kvtier::gpu::testing
