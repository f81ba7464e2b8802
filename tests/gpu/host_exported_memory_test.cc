// Host-backend contracts of exported memory (Runtime::AllocateExported / OpenExported):
// sharing with a plainly forked child, opening in the exporting process, the handle's
// format and how bad handles are refused, and that freeing leaks no fd or mapping.

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "kvtier/gpu/runtime.h"
#include "runtime_test_support.h"

namespace kvtier::gpu::testing {
namespace {

constexpr size_t kBytes = (size_t{1} << 16) + 24;

// Entries of /proc/self/fd (the directory's own fd included, the same each time).
int CountOpenFds() {
  int n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    ++n;
  }
  return n;
}

// Mappings of exported memory in this process (/proc/self/maps names memfd mappings).
int CountExportedMappings() {
  std::ifstream maps("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(maps, line);) {
    if (line.find("memfd:kvtier-exported") != std::string::npos) ++n;
  }
  return n;
}

TEST(HostExportedMemory, AForkedChildOpensTheHandleAndItsWritesReachTheParent) {
  std::unique_ptr<Runtime> runtime = Runtime::CreateHost();
  DeviceBuffer exported;
  std::string handle;
  KVTIER_ASSERT_GPU_OK(runtime->AllocateExported(kBytes, &exported, &handle));
  const std::vector<uint8_t> parent_bytes = ReferencePattern(1, kBytes);
  std::memcpy(exported.data(), parent_bytes.data(), kBytes);  // Host backend: plain stores.

  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The child: its own runtime opens the handle. Exit codes name the step that failed.
    int code = 0;
    {
      std::unique_ptr<Runtime> child = Runtime::CreateHost();
      DeviceBuffer opened;
      Stream stream;
      if (!child->OpenExported(handle, kBytes, &opened).ok()) {
        code = 1;
      } else if (std::memcmp(opened.data(), parent_bytes.data(), kBytes) != 0) {
        code = 2;
      } else if (!child->CreateStream(&stream).ok() ||
                 !child->LaunchFill(opened.data(), kBytes, 2, stream).ok() ||
                 !child->Synchronize(stream).ok()) {
        code = 3;
      }
    }
    ::_exit(code);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0) << "1: open failed, 2: parent's bytes unseen, 3: fill failed";
  const auto* data = static_cast<const uint8_t*>(exported.data());
  EXPECT_EQ(std::vector<uint8_t>(data, data + kBytes), ReferencePattern(2, kBytes));
}

TEST(HostExportedMemory, OpeningInTheExportingProcessMapsTheSamePagesAgain) {
  std::unique_ptr<Runtime> exporter = Runtime::CreateHost();
  std::unique_ptr<Runtime> opener = Runtime::CreateHost();
  DeviceBuffer exported, same_runtime, other_runtime, prefix;
  std::string handle;
  KVTIER_ASSERT_GPU_OK(exporter->AllocateExported(kBytes, &exported, &handle));
  KVTIER_ASSERT_GPU_OK(exporter->OpenExported(handle, kBytes, &same_runtime));
  KVTIER_ASSERT_GPU_OK(opener->OpenExported(handle, kBytes, &other_runtime));
  KVTIER_ASSERT_GPU_OK(opener->OpenExported(handle, 4096, &prefix));
  EXPECT_NE(same_runtime.data(), exported.data()) << "a second mapping, not the same pointer";
  EXPECT_EQ(other_runtime.size_bytes(), kBytes);
  EXPECT_EQ(prefix.size_bytes(), 4096u);
  EXPECT_EQ(other_runtime.runtime(), opener.get());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(other_runtime.data()) % Runtime::kDeviceAlignmentBytes, 0u);

  // Written through one mapping, read through the others.
  Stream stream;
  KVTIER_ASSERT_GPU_OK(opener->CreateStream(&stream));
  KVTIER_ASSERT_GPU_OK(opener->LaunchFill(other_runtime.data(), kBytes, 5, stream));
  KVTIER_ASSERT_GPU_OK(opener->Synchronize(stream));
  const std::vector<uint8_t> expected = ReferencePattern(5, kBytes);
  for (const DeviceBuffer* view : {&exported, &same_runtime}) {
    const auto* data = static_cast<const uint8_t*>(view->data());
    EXPECT_EQ(std::vector<uint8_t>(data, data + kBytes), expected);
  }
  EXPECT_EQ(std::memcmp(prefix.data(), expected.data(), 4096), 0);

  // Freeing the exporter's buffer first leaves the opened mappings intact.
  exported.Reset();
  const auto* data = static_cast<const uint8_t*>(other_runtime.data());
  EXPECT_EQ(std::vector<uint8_t>(data, data + kBytes), expected);
}

TEST(HostExportedMemory, HandleNamesThisProcessAFdAndTheSize) {
  std::unique_ptr<Runtime> runtime = Runtime::CreateHost();
  DeviceBuffer exported;
  std::string handle;
  KVTIER_ASSERT_GPU_OK(runtime->AllocateExported(kBytes, &exported, &handle));
  const std::string prefix = "host-ipc:v1:" + std::to_string(::getpid()) + ":";
  ASSERT_EQ(handle.substr(0, prefix.size()), prefix) << handle;
  const std::string suffix = ":" + std::to_string(kBytes);
  ASSERT_GT(handle.size(), prefix.size() + suffix.size());
  EXPECT_EQ(handle.substr(handle.size() - suffix.size()), suffix) << handle;
  const std::string fd =
      handle.substr(prefix.size(), handle.size() - prefix.size() - suffix.size());
  EXPECT_TRUE(std::filesystem::exists("/proc/self/fd/" + fd)) << handle;
}

TEST(HostExportedMemory, BadHandlesAreInvalidArgumentsNamingTheProblem) {
  std::unique_ptr<Runtime> runtime = Runtime::CreateHost();
  DeviceBuffer exported, out;
  std::string handle;
  KVTIER_ASSERT_GPU_OK(runtime->AllocateExported(kBytes, &exported, &handle));
  KVTIER_ASSERT_GPU_OK(runtime->Allocate(128, &out));
  void* const held = out.data();
  struct Case {
    std::string handle;
    size_t bytes;
    const char* needle;
  };
  const std::vector<Case> cases = {
      {"", 4096, "empty"},
      {"shm:/kvtier", 4096, "malformed"},
      {std::string(64, '\x01'), 4096, "CUDA"},
      {"host-ipc:v2:1:3:4096", 4096, "version"},
      {"host-ipc:v1:0:3:4096", 4096, "pid"},
      {"host-ipc:v1:x:3:4096", 4096, "pid"},
      {"host-ipc:v1:1:-3:4096", 4096, "fd"},
      {"host-ipc:v1:1:3", 4096, "fd"},
      {"host-ipc:v1:1:3:", 4096, "bytes"},
      {"host-ipc:v1:1:3:0", 4096, "bytes"},
      {"host-ipc:v1:1:3:4096:7", 4096, "bytes"},
      {handle, kBytes + 1, "larger than the exported size"},
      {handle, 0, "bytes must be > 0"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.handle + " / " + std::to_string(c.bytes));
    const GpuStatus s = runtime->OpenExported(c.handle, c.bytes, &out);
    EXPECT_EQ(s.code(), GpuCode::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find(c.needle), std::string::npos) << s.message();
    EXPECT_EQ(out.data(), held);
    EXPECT_EQ(out.size_bytes(), 128u);
  }
}

TEST(HostExportedMemory, OpeningAfterTheExporterFreedOrExitedIsUnavailable) {
  std::unique_ptr<Runtime> runtime = Runtime::CreateHost();
  DeviceBuffer exported, out;
  std::string handle;
  KVTIER_ASSERT_GPU_OK(runtime->AllocateExported(kBytes, &exported, &handle));
  exported.Reset();
  GpuStatus s = runtime->OpenExported(handle, kBytes, &out);
  EXPECT_EQ(s.code(), GpuCode::kUnavailable) << s.ToString();
  EXPECT_TRUE(out.empty());

  // A child exports, sends the handle through a pipe and exits before it is opened.
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(fds[0]);
    std::unique_ptr<Runtime> child = Runtime::CreateHost();
    DeviceBuffer buffer;
    std::string child_handle;
    const bool ok = child->AllocateExported(kBytes, &buffer, &child_handle).ok() &&
                    ::write(fds[1], child_handle.data(), child_handle.size()) ==
                        static_cast<ssize_t>(child_handle.size());
    ::_exit(ok ? 0 : 1);  // Exits with the memory exported.
  }
  ::close(fds[1]);
  std::string child_handle(256, '\0');
  const ssize_t n = ::read(fds[0], child_handle.data(), child_handle.size());
  ::close(fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ASSERT_GT(n, 0);
  child_handle.resize(static_cast<size_t>(n));
  s = runtime->OpenExported(child_handle, kBytes, &out);
  EXPECT_EQ(s.code(), GpuCode::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("/proc/" + std::to_string(pid) + "/fd/"), std::string::npos)
      << s.message();
  EXPECT_TRUE(out.empty());
}

TEST(HostExportedMemory, FreeingExportedAndOpenedBuffersLeaksNoFdOrMapping) {
  std::unique_ptr<Runtime> runtime = Runtime::CreateHost();
  const int fds_before = CountOpenFds();
  const int maps_before = CountExportedMappings();
  {
    std::vector<DeviceBuffer> exported(3), opened(6);
    for (int i = 0; i < 3; ++i) {
      std::string handle;
      KVTIER_ASSERT_GPU_OK(runtime->AllocateExported(kBytes, &exported[i], &handle));
      KVTIER_ASSERT_GPU_OK(runtime->OpenExported(handle, kBytes, &opened[2 * i]));
      KVTIER_ASSERT_GPU_OK(runtime->OpenExported(handle, 4096, &opened[2 * i + 1]));
    }
    // Each export keeps its memfd open for openers; an opened mapping keeps no fd.
    EXPECT_EQ(CountOpenFds(), fds_before + 3);
    EXPECT_EQ(CountExportedMappings(), maps_before + 9);
    // Freed in either order.
    opened[0].Reset();
    exported[1].Reset();
  }
  EXPECT_EQ(CountOpenFds(), fds_before);
  EXPECT_EQ(CountExportedMappings(), maps_before);
}

}  // namespace
}  // namespace kvtier::gpu::testing
