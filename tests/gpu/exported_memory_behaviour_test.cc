// Exported device memory (Runtime::AllocateExported / OpenExported) as every backend must
// show it. Instantiated per backend with RuntimeBehaviourTest by runtime_test.cc (host) and
// cuda_runtime_test.cc (CUDA, skipping without a GPU).
//
// The cross-process test runs this same test binary again as the opener (posix_spawn, i.e.
// fork + exec: a CUDA context does not survive a plain fork), passing the handle in the
// environment; the child is the disabled test at the bottom, selected by --gtest_filter.

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "runtime_test_support.h"

namespace kvtier::gpu::testing {
namespace {

// Environment of the child process: the handle (hex: a CUDA handle is binary) and backend.
constexpr char kHandleEnv[] = "KVTIER_TEST_EXPORTED_HANDLE";
constexpr char kBackendEnv[] = "KVTIER_TEST_EXPORTED_BACKEND";
constexpr char kChildFilter[] =
    "--gtest_filter=ExportedMemoryChild.DISABLED_ReadsTheParentsBytesAndOverwritesThem";
constexpr size_t kSharedBytes = (size_t{1} << 20) + 40;  // Not a whole number of pages.
constexpr uint64_t kParentSeed = 21;                     // Written by the exporter.
constexpr uint64_t kChildSeed = 22;                      // Written by the opener.

std::string Hex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

std::string Unhex(std::string_view hex) {
  auto nibble = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(nibble(hex[i]) << 4 | nibble(hex[i + 1])));
  }
  return out;
}

// Runs the child test in a new process of this binary with `handle` exported to it;
// returns its exit status (0: the child test passed), or -1 when it did not run.
int RunOpenerProcess(Backend backend, const std::string& handle) {
  std::vector<char> exe(4096, '\0');
  if (::readlink("/proc/self/exe", exe.data(), exe.size() - 1) <= 0) return -1;
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    // The child must not overwrite the parent's XML report.
    if (std::string_view(*e).starts_with("GTEST_OUTPUT=")) continue;
    env.emplace_back(*e);
  }
  env.push_back(std::string(kHandleEnv) + "=" + Hex(handle));
  env.push_back(std::string(kBackendEnv) + "=" + (backend == Backend::kHost ? "host" : "cuda"));
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string filter = kChildFilter, disabled = "--gtest_also_run_disabled_tests";
  std::vector<char*> argv = {exe.data(), filter.data(), disabled.data(), nullptr};
  pid_t pid = 0;
  if (::posix_spawn(&pid, exe.data(), nullptr, nullptr, argv.data(), envp.data()) != 0) return -1;
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

TEST_P(RuntimeBehaviourTest, ExportedMemoryIsSharedWithAnotherProcess) {
  DeviceBuffer exported;
  std::string handle;
  Stream stream;
  KVTIER_ASSERT_GPU_OK(runtime_->AllocateExported(kSharedBytes, &exported, &handle));
  KVTIER_ASSERT_GPU_OK(runtime_->CreateStream(&stream));
  KVTIER_ASSERT_GPU_OK(runtime_->LaunchFill(exported.data(), kSharedBytes, kParentSeed, stream));
  KVTIER_ASSERT_GPU_OK(runtime_->Synchronize(stream));

  ASSERT_EQ(RunOpenerProcess(GetParam(), handle), 0) << "the opener process failed (see above)";

  std::vector<uint8_t> seen(kSharedBytes, 0);
  KVTIER_ASSERT_GPU_OK(runtime_->CopyAsync(seen.data(), exported.data(), kSharedBytes, stream));
  KVTIER_ASSERT_GPU_OK(runtime_->Synchronize(stream));
  EXPECT_EQ(seen, ReferencePattern(kChildSeed, kSharedBytes))
      << "the opener's writes did not reach the exporter's buffer";
}

TEST_P(RuntimeBehaviourTest, ExportedMemoryIsAnOrdinaryAlignedBuffer) {
  DeviceBuffer exported;
  std::string handle;
  KVTIER_ASSERT_GPU_OK(runtime_->AllocateExported(3000, &exported, &handle));
  EXPECT_FALSE(handle.empty());
  EXPECT_EQ(exported.size_bytes(), 3000u);
  EXPECT_EQ(exported.runtime(), runtime_.get());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(exported.data()) % Runtime::kDeviceAlignmentBytes, 0u);

  // A second export replaces (frees) what the buffer held, as Allocate does.
  std::string second;
  KVTIER_ASSERT_GPU_OK(runtime_->AllocateExported(5000, &exported, &second));
  EXPECT_EQ(exported.size_bytes(), 5000u);
  EXPECT_NE(second, handle);

  handle = second;
  const GpuStatus s = runtime_->AllocateExported(size_t{1} << 62, &exported, &second);
  EXPECT_EQ(s.code(), GpuCode::kOutOfMemory) << s.ToString();
  EXPECT_EQ(exported.size_bytes(), 5000u);  // A failed call leaves the outputs as they were.
  EXPECT_EQ(second, handle);
  exported.Reset();
  EXPECT_TRUE(exported.empty());
}

TEST_P(RuntimeBehaviourTest, ExportAndOpenRejectBadArgumentsAndKeepTheOutput) {
  DeviceBuffer out;
  std::string handle = "unchanged";
  EXPECT_EQ(runtime_->AllocateExported(0, &out, &handle).code(), GpuCode::kInvalidArgument);
  EXPECT_EQ(runtime_->AllocateExported(64, nullptr, &handle).code(), GpuCode::kInvalidArgument);
  EXPECT_EQ(runtime_->AllocateExported(64, &out, nullptr).code(), GpuCode::kInvalidArgument);
  EXPECT_EQ(handle, "unchanged");
  EXPECT_TRUE(out.empty());

  KVTIER_ASSERT_GPU_OK(runtime_->Allocate(64, &out));
  void* const held = out.data();
  // A handle of the other backend is refused naming the mismatch.
  const bool host = GetParam() == Backend::kHost;
  const std::string foreign = host ? std::string(64, '\x5c') : "host-ipc:v1:1:3:4096";
  auto rejects = [&](std::string_view h, size_t bytes, const char* needle) {
    const GpuStatus s = runtime_->OpenExported(h, bytes, &out);
    EXPECT_EQ(s.code(), GpuCode::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
    EXPECT_EQ(out.data(), held);
    EXPECT_EQ(out.size_bytes(), 64u);
  };
  rejects(foreign, 4096, host ? "CUDA" : "host backend");
  rejects("", 4096, "empty");
  rejects("x", 4096, "malformed");
  rejects(foreign, 0, "bytes");
  EXPECT_EQ(runtime_->OpenExported(foreign, 64, nullptr).code(), GpuCode::kInvalidArgument);
}

}  // namespace

// The opener half of ExportedMemoryIsSharedWithAnotherProcess: runs only in the process
// that test starts (disabled otherwise). Checks it sees the exporter's bytes, then
// overwrites them with its own pattern.
TEST(ExportedMemoryChild, DISABLED_ReadsTheParentsBytesAndOverwritesThem) {
  const char* hex = std::getenv(kHandleEnv);
  const char* backend = std::getenv(kBackendEnv);
  ASSERT_TRUE(hex != nullptr && backend != nullptr)
      << "run by RuntimeBehaviourTest.ExportedMemoryIsSharedWithAnotherProcess";
  std::unique_ptr<Runtime> runtime;
  if (std::string_view(backend) == "host") {
    runtime = Runtime::CreateHost();
  } else {
    KVTIER_ASSERT_GPU_OK(Runtime::CreateCuda(0, &runtime));
  }
  DeviceBuffer opened;
  Stream stream;
  KVTIER_ASSERT_GPU_OK(runtime->OpenExported(Unhex(hex), kSharedBytes, &opened));
  ASSERT_EQ(opened.size_bytes(), kSharedBytes);
  KVTIER_ASSERT_GPU_OK(runtime->CreateStream(&stream));
  std::vector<uint8_t> seen(kSharedBytes, 0);
  KVTIER_ASSERT_GPU_OK(runtime->CopyAsync(seen.data(), opened.data(), kSharedBytes, stream));
  KVTIER_ASSERT_GPU_OK(runtime->Synchronize(stream));
  ASSERT_EQ(seen, ReferencePattern(kParentSeed, kSharedBytes)) << "the exporter's bytes";
  KVTIER_ASSERT_GPU_OK(runtime->LaunchFill(opened.data(), kSharedBytes, kChildSeed, stream));
  KVTIER_ASSERT_GPU_OK(runtime->Synchronize(stream));
}

}  // namespace kvtier::gpu::testing
