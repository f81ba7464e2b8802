// Behaviour every Runtime backend must show. Instantiated per backend by runtime_test.cc
// (host) and cuda_runtime_test.cc (CUDA).
//
// Queued device work is held back with a Gate (a blocking host function) so that ordering
// is checked deterministically, not by timing. Copies behind a gate are device-to-device:
// under CUDA a copy to pageable host memory may block the calling thread.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "runtime_test_support.h"

namespace kvtier::gpu::testing {
namespace {

using Clock = std::chrono::steady_clock;

// Long enough for a wrongly unblocked stream to have run its next step.
constexpr auto kSettle = std::chrono::milliseconds(50);

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<uint8_t> out(n);
  for (auto& b : out) b = static_cast<uint8_t>(gen());
  return out;
}

TEST_P(RuntimeBehaviourTest, CopiesBytesHostToDeviceToDeviceToHost) {
  const size_t bytes = (1 << 20) + 3;
  const std::vector<uint8_t> src = RandomBytes(bytes, 1);
  std::vector<uint8_t> dst(bytes, 0);
  DeviceBuffer a, b;
  Stream stream;
  KVTIER_ASSERT_GPU_OK(runtime_->Allocate(bytes, &a));
  KVTIER_ASSERT_GPU_OK(runtime_->Allocate(bytes, &b));
  KVTIER_ASSERT_GPU_OK(runtime_->CreateStream(&stream));

  KVTIER_ASSERT_GPU_OK(runtime_->CopyAsync(a.data(), src.data(), bytes, stream));
  KVTIER_ASSERT_GPU_OK(runtime_->CopyAsync(b.data(), a.data(), bytes, stream));
  KVTIER_ASSERT_GPU_OK(runtime_->CopyAsync(dst.data(), b.data(), bytes, stream));
  KVTIER_ASSERT_GPU_OK(runtime_->Synchronize(stream));

  EXPECT_EQ(dst, src);
}

TEST_P(RuntimeBehaviourTest, WorkOnOneStreamRunsInQueueOrder) {
  const size_t bytes = 4096;
  DeviceBuffer scratch, out1, out2;
  Stream stream;
  KVTIER_ASSERT_GPU_OK(runtime_->Allocate(bytes, &scratch));
  KVTIER_ASSERT_GPU_OK(runtime_->Allocate(bytes, &out1));
  KVTIER_ASSERT_GPU_OK(runtime_->Allocate(bytes, &out2));
  KVTIER_ASSERT_GPU_OK(runtime_->CreateStream(&stream));

  // Host functions record their queue position; fills and copies reuse one scratch buffer,
  // so each copy sees the fill queued just before it only if the stream runs in order.
  // Written only by the stream's host functions; shared so that it outlives queued work
  // if an assertion returns early.
  auto ran = std::make_shared<std::vector<int>>();
  for (int i = 0; i < 100; ++i) {
    KVTIER_ASSERT_GPU_OK(runtime_->LaunchHostFunc(stream, [ran, i] { ran->push_back(i); }));
  }
  KVTIER_ASSERT_GPU_OK(runtime_->LaunchFill(scratch.data(), bytes, 11, stream));
  KVTIER_ASSERT_GPU_OK(runtime_->CopyAsync(out1.data(), scratch.data(), bytes, stream));
  KVTIER_ASSERT_GPU_OK(runtime_->LaunchFill(scratch.data(), bytes, 22, stream));
  KVTIER_ASSERT_GPU_OK(runtime_->CopyAsync(out2.data(), scratch.data(), bytes, stream));
  KVTIER_ASSERT_GPU_OK(runtime_->Synchronize(stream));

  std::vector<int> expected(100);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(*ran, expected);
  std::vector<uint8_t> host1(bytes), host2(bytes);
  KVTIER_ASSERT_GPU_OK(runtime_->CopyAsync(host1.data(), out1.data(), bytes, stream));
  KVTIER_ASSERT_GPU_OK(runtime_->CopyAsync(host2.data(), out2.data(), bytes, stream));
  KVTIER_ASSERT_GPU_OK(runtime_->Synchronize(stream));
  EXPECT_EQ(host1, ReferencePattern(11, bytes));
  EXPECT_EQ(host2, ReferencePattern(22, bytes));
}

TEST_P(RuntimeBehaviourTest, EventRecordedAfterCopyCompletesOnlyAfterCopy) {
  const size_t bytes = 8 << 20;
  DeviceBuffer src, dst;
  Stream stream;
  Event before_copy, after_copy;
  KVTIER_ASSERT_GPU_OK(runtime_->Allocate(bytes, &src));
  KVTIER_ASSERT_GPU_OK(runtime_->Allocate(bytes, &dst));
  KVTIER_ASSERT_GPU_OK(runtime_->CreateStream(&stream));
  KVTIER_ASSERT_GPU_OK(runtime_->CreateEvent(&before_copy));
  KVTIER_ASSERT_GPU_OK(runtime_->CreateEvent(&after_copy));
  KVTIER_ASSERT_GPU_OK(runtime_->LaunchFill(src.data(), bytes, 33, stream));
  KVTIER_ASSERT_GPU_OK(runtime_->LaunchFill(dst.data(), bytes, 44, stream));
  KVTIER_ASSERT_GPU_OK(runtime_->Synchronize(stream));

  Gate gate;  // Declared after `stream`: destroyed (opened) first.
  KVTIER_ASSERT_GPU_OK(runtime_->LaunchHostFunc(stream, gate.Waiter()));
  KVTIER_ASSERT_GPU_OK(runtime_->RecordEvent(before_copy, stream));
  KVTIER_ASSERT_GPU_OK(runtime_->CopyAsync(dst.data(), src.data(), bytes, stream));
  KVTIER_ASSERT_GPU_OK(runtime_->RecordEvent(after_copy, stream));

  std::this_thread::sleep_for(kSettle);
  bool complete = true;
  KVTIER_ASSERT_GPU_OK(runtime_->QueryEvent(after_copy, &complete));
  EXPECT_FALSE(complete) << "event fired while the copy before it was held back";

  const Clock::time_point opened_at = gate.Open();
  KVTIER_ASSERT_GPU_OK(runtime_->SynchronizeEvent(after_copy));
  KVTIER_ASSERT_GPU_OK(runtime_->QueryEvent(after_copy, &complete));
  EXPECT_TRUE(complete);

  // The event has fired, so the copy must be complete: read dst back on a second stream
  // without synchronizing the first.
  Stream reader;
  KVTIER_ASSERT_GPU_OK(runtime_->CreateStream(&reader));
  std::vector<uint8_t> host(bytes);
  KVTIER_ASSERT_GPU_OK(runtime_->CopyAsync(host.data(), dst.data(), bytes, reader));
  KVTIER_ASSERT_GPU_OK(runtime_->Synchronize(reader));
  EXPECT_EQ(host, ReferencePattern(33, bytes));

  // Where the backend stamps completion times, they order the same way.
  Clock::time_point before_at, after_at;
  const GpuStatus s = runtime_->EventCompletionTime(after_copy, &after_at);
  if (s.code() == GpuCode::kUnsupported) return;
  KVTIER_ASSERT_GPU_OK(s);
  KVTIER_ASSERT_GPU_OK(runtime_->EventCompletionTime(before_copy, &before_at));
  EXPECT_GE(before_at, opened_at);
  EXPECT_GE(after_at, before_at);
}

TEST_P(RuntimeBehaviourTest, StreamWaitEventMakesSecondStreamStartAfterEvent) {
  const size_t bytes = 1 << 20;
  DeviceBuffer produced, consumed;
  Stream producer, consumer;
  Event ready;
  KVTIER_ASSERT_GPU_OK(runtime_->Allocate(bytes, &produced));
  KVTIER_ASSERT_GPU_OK(runtime_->Allocate(bytes, &consumed));
  KVTIER_ASSERT_GPU_OK(runtime_->CreateStream(&producer));
  KVTIER_ASSERT_GPU_OK(runtime_->CreateStream(&consumer));
  KVTIER_ASSERT_GPU_OK(runtime_->CreateEvent(&ready));
  KVTIER_ASSERT_GPU_OK(runtime_->LaunchFill(produced.data(), bytes, 55, producer));
  KVTIER_ASSERT_GPU_OK(runtime_->Synchronize(producer));

  Gate gate;
  KVTIER_ASSERT_GPU_OK(runtime_->LaunchHostFunc(producer, gate.Waiter()));
  KVTIER_ASSERT_GPU_OK(runtime_->LaunchFill(produced.data(), bytes, 66, producer));
  KVTIER_ASSERT_GPU_OK(runtime_->RecordEvent(ready, producer));

  struct Started {
    std::atomic<bool> yes{false};
    Clock::time_point at;  // Written before `yes` is set.
  };
  auto started = std::make_shared<Started>();  // Outlives the host function.
  KVTIER_ASSERT_GPU_OK(runtime_->StreamWaitEvent(consumer, ready));
  KVTIER_ASSERT_GPU_OK(runtime_->LaunchHostFunc(consumer, [started] {
    started->at = Clock::now();
    started->yes = true;
  }));
  KVTIER_ASSERT_GPU_OK(runtime_->CopyAsync(consumed.data(), produced.data(), bytes, consumer));

  std::this_thread::sleep_for(kSettle);
  EXPECT_FALSE(started->yes.load()) << "consumer ran before the producer's event";

  gate.Open();
  KVTIER_ASSERT_GPU_OK(runtime_->Synchronize(consumer));
  EXPECT_TRUE(started->yes.load());
  std::vector<uint8_t> host(bytes);
  KVTIER_ASSERT_GPU_OK(runtime_->CopyAsync(host.data(), consumed.data(), bytes, consumer));
  KVTIER_ASSERT_GPU_OK(runtime_->Synchronize(consumer));
  EXPECT_EQ(host, ReferencePattern(66, bytes)) << "consumer copied before the producer's fill";

  Clock::time_point ready_at;
  const GpuStatus s = runtime_->EventCompletionTime(ready, &ready_at);
  if (s.code() == GpuCode::kUnsupported) return;
  KVTIER_ASSERT_GPU_OK(s);
  EXPECT_GE(started->at, ready_at);
}

TEST_P(RuntimeBehaviourTest, FillMatchesIndependentReferenceAtAnyOffsetAndSize) {
  const size_t kBuffer = 70000;
  const size_t kSizes[] = {1, 7, 8, 9, 1000, 65536 + 5};
  const size_t kOffsets[] = {0, 3, 8};
  DeviceBuffer buffer;
  Stream stream;
  KVTIER_ASSERT_GPU_OK(runtime_->Allocate(kBuffer, &buffer));
  KVTIER_ASSERT_GPU_OK(runtime_->CreateStream(&stream));
  auto* base = static_cast<uint8_t*>(buffer.data());
  uint64_t seed = 0x1234;
  for (size_t size : kSizes) {
    for (size_t offset : kOffsets) {
      ++seed;
      SCOPED_TRACE(::testing::Message() << "size " << size << " offset " << offset);
      KVTIER_ASSERT_GPU_OK(runtime_->LaunchFill(base, kBuffer, 7, stream));
      KVTIER_ASSERT_GPU_OK(runtime_->LaunchFill(base + offset, size, seed, stream));
      std::vector<uint8_t> host(kBuffer);
      KVTIER_ASSERT_GPU_OK(runtime_->CopyAsync(host.data(), base, kBuffer, stream));
      KVTIER_ASSERT_GPU_OK(runtime_->Synchronize(stream));

      std::vector<uint8_t> expected = ReferencePattern(7, kBuffer);  // Untouched around it.
      const std::vector<uint8_t> fill = ReferencePattern(seed, size);
      std::memcpy(expected.data() + offset, fill.data(), size);
      ASSERT_EQ(host, expected);
    }
  }
}

TEST_P(RuntimeBehaviourTest, NeverRecordedEventIsCompleteAndAddsNoWait) {
  Stream stream;
  Event event;
  KVTIER_ASSERT_GPU_OK(runtime_->CreateStream(&stream));
  KVTIER_ASSERT_GPU_OK(runtime_->CreateEvent(&event));
  bool complete = false;
  KVTIER_ASSERT_GPU_OK(runtime_->QueryEvent(event, &complete));
  EXPECT_TRUE(complete);
  KVTIER_ASSERT_GPU_OK(runtime_->SynchronizeEvent(event));
  KVTIER_ASSERT_GPU_OK(runtime_->StreamWaitEvent(stream, event));
  KVTIER_ASSERT_GPU_OK(runtime_->Synchronize(stream));
}

TEST_P(RuntimeBehaviourTest, AllocationsAreAlignedAndHugeOnesFailCleanly) {
  DeviceBuffer buffer;
  KVTIER_ASSERT_GPU_OK(runtime_->Allocate(1, &buffer));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer.data()) % Runtime::kDeviceAlignmentBytes, 0u);
  EXPECT_EQ(buffer.size_bytes(), 1u);
  EXPECT_EQ(buffer.runtime(), runtime_.get());

  const GpuStatus s = runtime_->Allocate(size_t{1} << 62, &buffer);
  EXPECT_EQ(s.code(), GpuCode::kOutOfMemory) << s.ToString();
  EXPECT_EQ(buffer.size_bytes(), 1u);  // A failed call leaves *out as it was.
}

TEST_P(RuntimeBehaviourTest, RejectsInvalidArgumentsWithoutQueueingWork) {
  std::unique_ptr<Runtime> other = Runtime::CreateHost();  // Outlives foreign_stream.
  DeviceBuffer buffer;
  Stream stream, empty_stream, foreign_stream;
  Event event;
  KVTIER_ASSERT_GPU_OK(runtime_->Allocate(64, &buffer));
  KVTIER_ASSERT_GPU_OK(runtime_->CreateStream(&stream));
  KVTIER_ASSERT_GPU_OK(runtime_->CreateEvent(&event));
  KVTIER_ASSERT_GPU_OK(other->CreateStream(&foreign_stream));
  auto* p = static_cast<uint8_t*>(buffer.data());
  bool complete = false;

  const GpuStatus statuses[] = {
      runtime_->Allocate(0, &buffer),
      runtime_->Allocate(64, nullptr),
      runtime_->CreateStream(nullptr),
      runtime_->CreateEvent(nullptr),
      runtime_->CopyAsync(p, p + 8, 16, stream),  // Overlapping ranges.
      runtime_->CopyAsync(nullptr, p, 16, stream),
      runtime_->CopyAsync(p, p + 32, 16, empty_stream),
      runtime_->CopyAsync(p, p + 32, 16, foreign_stream),
      runtime_->LaunchFill(nullptr, 16, 1, stream),
      runtime_->LaunchHostFunc(stream, std::function<void()>()),
      runtime_->RecordEvent(event, foreign_stream),
      runtime_->QueryEvent(event, nullptr),
      runtime_->QueryEvent(Event(), &complete),
      runtime_->StreamWaitEvent(foreign_stream, event),
      runtime_->Synchronize(empty_stream),
  };
  for (const GpuStatus& s : statuses) {
    EXPECT_EQ(s.code(), GpuCode::kInvalidArgument) << s.ToString();
    EXPECT_FALSE(s.message().empty());
  }
  KVTIER_ASSERT_GPU_OK(runtime_->CopyAsync(nullptr, nullptr, 0, stream));  // Zero bytes: no-op.
  KVTIER_ASSERT_GPU_OK(runtime_->Synchronize(stream));
}

}  // namespace
}  // namespace kvtier::gpu::testing
