// WritePipelined: batch k+1 is prepared while batch k is written, writes stay in order and
// never overlap, at most max_batches, and a throwing prepare waits for the write in flight.
#include "kvtier/tiers/write_pipeline.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <vector>

namespace kvtier {
namespace {

using namespace std::chrono_literals;

struct Batch {
  int number = 0;
  std::byte* buffer = nullptr;
};

TEST(WritePipelinedTest, TheNextBatchIsPreparedWhileThisOneIsWrittenAndWritesStayInOrder) {
  StagingBuffer staging[2];
  std::mutex mu;
  std::condition_variable cv;
  int prepared = 0;
  std::vector<int> written;
  std::vector<std::byte*> buffers;
  std::atomic<int> writing{0};
  bool overlapped_every_time = true;
  const size_t n = WritePipelined<Batch>(
      staging, 100,
      [&](StagingBuffer& s) -> std::optional<Batch> {
        std::lock_guard lock(mu);
        if (prepared == 5) return std::nullopt;
        ++prepared;
        cv.notify_all();
        return Batch{prepared, s.Reserve(4096)};
      },
      [&](Batch& b) {
        EXPECT_EQ(writing.fetch_add(1), 0) << "two writes at once";
        std::unique_lock lock(mu);
        // Batch k's write waits for batch k+1 to be prepared (bounded): only a pipeline
        // that prepares while it writes gets there. The last batch has no next one.
        if (b.number < 5 && !cv.wait_for(lock, 10s, [&] { return prepared > b.number; })) {
          overlapped_every_time = false;
        }
        written.push_back(b.number);
        buffers.push_back(b.buffer);
        writing.fetch_sub(1);
      });
  EXPECT_EQ(n, 5u);
  EXPECT_TRUE(overlapped_every_time);
  EXPECT_EQ(written, (std::vector<int>{1, 2, 3, 4, 5}));
  ASSERT_EQ(buffers.size(), 5u);
  for (size_t i = 1; i < buffers.size(); ++i) {
    EXPECT_NE(buffers[i], buffers[i - 1]) << "batch " << i + 1 << " reused the buffer in flight";
  }
}

TEST(WritePipelinedTest, StopsAtMaxBatchesWithEveryTakenBatchWritten) {
  StagingBuffer staging[2];
  int prepared = 0, written = 0;
  const size_t n = WritePipelined<Batch>(
      staging, 3, [&](StagingBuffer&) { return std::optional<Batch>(Batch{++prepared}); },
      [&](Batch&) { ++written; });
  EXPECT_EQ(n, 3u);
  EXPECT_EQ(prepared, 3);
  EXPECT_EQ(written, 3);
  EXPECT_EQ(WritePipelined<Batch>(
                staging, 3, [](StagingBuffer&) { return std::optional<Batch>(); }, [](Batch&) {}),
            0u);
}

TEST(WritePipelinedTest, APrepareThatThrowsWaitsForTheWriteInFlight) {
  StagingBuffer staging[2];
  int prepared = 0;
  std::atomic<bool> write_done{false};
  EXPECT_THROW(WritePipelined<Batch>(
                   staging, 10,
                   [&](StagingBuffer&) -> std::optional<Batch> {
                     if (prepared++ == 1) throw std::runtime_error("out of memory");
                     return Batch{prepared};
                   },
                   [&](Batch&) {
                     std::this_thread::sleep_for(50ms);
                     write_done = true;
                   }),
               std::runtime_error);
  EXPECT_TRUE(write_done) << "the exception left before the write it overlapped ended";
}

}  // namespace
}  // namespace kvtier
