// IoUringFileDevice on real files with O_DIRECT: round trips, batches deeper
// than the queue, start-up errors, and faults injected by wrapping the device.
#include "kvtier/tiers/io_uring_file_device.h"

#include <gtest/gtest.h>
#include <liburing.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <thread>
#include <vector>

#include "testing/fault_injection_device.h"

namespace kvtier {
namespace {

namespace fs = std::filesystem;

// A 4 KiB-aligned buffer.
struct Aligned {
  explicit Aligned(size_t n)
      : bytes(static_cast<std::byte*>(std::aligned_alloc(kBlockBytes, n))), size(n) {}
  ~Aligned() { std::free(bytes); }
  std::span<std::byte> span() { return {bytes, size}; }
  std::byte* bytes;
  size_t size;
};

void Fill(std::span<std::byte> s, uint8_t seed) {
  for (size_t i = 0; i < s.size(); ++i) s[i] = std::byte(static_cast<uint8_t>(seed + i * 13));
}

class IoUringFileDeviceTest : public ::testing::Test {
 protected:
  // Under the build tree's file system (a disk), not /tmp (it may be tmpfs).
  IoUringFileDeviceTest() : dir_(fs::current_path() / ("nvme-test-" + std::to_string(getpid()))) {
    fs::create_directories(dir_);
  }
  ~IoUringFileDeviceTest() override { fs::remove_all(dir_); }

  std::unique_ptr<IoUringFileDevice> OpenOrDie(uint64_t bytes, uint32_t depth = 4) {
    auto d = IoUringFileDevice::Open({(dir_ / "slots.dat").string(), bytes, depth, {}});
    EXPECT_TRUE(d.ok()) << d.status().ToString();
    return d.ok() ? std::move(d).value() : nullptr;
  }

  fs::path dir_;
};

TEST_F(IoUringFileDeviceTest, WrittenBlocksReadBackIdentically) {
  auto dev = OpenOrDie(1 << 20);
  ASSERT_TRUE(dev);
  EXPECT_EQ(fs::file_size(dir_ / "slots.dat"), 1u << 20);
  Aligned out(3 * kBlockBytes), in(3 * kBlockBytes);
  Fill(out.span(), 7);
  ASSERT_TRUE(dev->Submit(std::vector<IoRequest>{{IoRequest::Op::kWrite, 8192, out.span()}}).ok());
  ASSERT_TRUE(dev->Sync().ok());
  std::memset(in.bytes, 0, in.size);
  ASSERT_TRUE(dev->Submit(std::vector<IoRequest>{{IoRequest::Op::kRead, 8192, in.span()}}).ok());
  EXPECT_EQ(std::memcmp(out.bytes, in.bytes, in.size), 0);
  EXPECT_EQ(dev->counters().write_bytes.load(), 3 * kBlockBytes);
  EXPECT_EQ(dev->counters().read_bytes.load(), 3 * kBlockBytes);
}

// Issue 10, item 6: a submit error used to return with requests in flight and
// others still queued in the ring, which the next batch then submitted and
// whose completions it took for its own. The real io_uring_submit_and_wait,
// wrapped so that one call fails with EIO.
TEST_F(IoUringFileDeviceTest, ASubmitErrorLeavesNothingInFlightForTheNextBatch) {
  constexpr size_t kBlocks = 32;
  std::atomic<int> calls{0};
  IoUringFileOptions o{(dir_ / "slots.dat").string(), 1 << 20, 4, {}};
  o.submit_and_wait = [&](io_uring* ring, unsigned wait_nr) {
    if (++calls == 3) return -EIO;
    return io_uring_submit_and_wait(ring, wait_nr);
  };
  auto opened = IoUringFileDevice::Open(o);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  IoUringFileDevice& dev = **opened;
  Aligned out(kBlocks * kBlockBytes), in(kBlocks * kBlockBytes);
  std::memset(out.bytes, 0xAB, out.size);
  std::vector<IoRequest> writes, reads;
  for (size_t b = 0; b < kBlocks; ++b) {
    writes.push_back(
        {IoRequest::Op::kWrite, b * kBlockBytes, out.span().subspan(b * kBlockBytes, kBlockBytes)});
    reads.push_back(
        {IoRequest::Op::kRead, b * kBlockBytes, in.span().subspan(b * kBlockBytes, kBlockBytes)});
  }
  const Status failed = dev.Submit(writes);
  EXPECT_FALSE(failed.ok());
  EXPECT_NE(failed.message().find("io_uring_submit"), std::string::npos) << failed.ToString();
  // The next batch reads every block itself: each is all written or all
  // untouched (the file starts as zeros), never left unread (0xEE).
  std::memset(in.bytes, 0xEE, in.size);
  const Status read = dev.Submit(reads);
  ASSERT_TRUE(read.ok()) << read.ToString();
  size_t written = 0;
  for (size_t b = 0; b < kBlocks; ++b) {
    const std::byte first = in.bytes[b * kBlockBytes];
    ASSERT_TRUE(first == std::byte{0xAB} || first == std::byte{0}) << "block " << b << " unread";
    written += first == std::byte{0xAB};
    for (size_t k = 0; k < kBlockBytes; ++k) {
      ASSERT_EQ(in.bytes[b * kBlockBytes + k], first) << "block " << b << " torn at " << k;
    }
  }
  EXPECT_LT(written, kBlocks) << "the failed submit stopped the batch";
  // And the device keeps working: a full round trip.
  ASSERT_TRUE(dev.Submit(writes).ok());
  ASSERT_TRUE(dev.Submit(reads).ok());
  EXPECT_EQ(std::memcmp(in.bytes, out.bytes, in.size), 0);
}

// The no-ops a failed submit leaves in the submission queue used to stay
// there: with the queue full of them, the next batch could queue nothing and
// returned OK having read nothing (seen as a flake of the test above).
TEST_F(IoUringFileDeviceTest, AFailedSubmitOfAFullQueueLeavesRoomForTheNextBatch) {
  std::atomic<int> calls{0};
  IoUringFileOptions o{(dir_ / "slots.dat").string(), 1 << 20, 4, {}};
  o.submit_and_wait = [&](io_uring* ring, unsigned wait_nr) {
    if (++calls == 1) return -EIO;  // the first submit, of a full queue of 4 writes
    return io_uring_submit_and_wait(ring, wait_nr);
  };
  auto opened = IoUringFileDevice::Open(o);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  IoUringFileDevice& dev = **opened;
  Aligned out(8 * kBlockBytes), in(8 * kBlockBytes);
  std::memset(out.bytes, 0xAB, out.size);
  std::vector<IoRequest> writes, reads;
  for (size_t b = 0; b < 8; ++b) {
    writes.push_back(
        {IoRequest::Op::kWrite, b * kBlockBytes, out.span().subspan(b * kBlockBytes, kBlockBytes)});
    reads.push_back(
        {IoRequest::Op::kRead, b * kBlockBytes, in.span().subspan(b * kBlockBytes, kBlockBytes)});
  }
  EXPECT_FALSE(dev.Submit(writes).ok());
  std::memset(in.bytes, 0xEE, in.size);
  ASSERT_TRUE(dev.Submit(reads).ok());
  for (size_t b = 0; b < 8; ++b) {
    EXPECT_EQ(in.bytes[b * kBlockBytes], std::byte{0}) << "block " << b << " unread (nothing "
                                                       << "was written: the submit failed)";
  }
  ASSERT_TRUE(dev.Submit(writes).ok());
  ASSERT_TRUE(dev.Submit(reads).ok());
  EXPECT_EQ(std::memcmp(in.bytes, out.bytes, in.size), 0);
}

TEST_F(IoUringFileDeviceTest, BatchDeeperThanTheQueueCompletesEveryRequest) {
  auto dev = OpenOrDie(1 << 20, /*depth=*/4);
  ASSERT_TRUE(dev);
  constexpr int kN = 37;
  std::vector<std::unique_ptr<Aligned>> bufs;
  std::vector<IoRequest> writes, reads;
  for (int i = 0; i < kN; ++i) {
    bufs.push_back(std::make_unique<Aligned>(kBlockBytes));
    Fill(bufs.back()->span(), static_cast<uint8_t>(i));
    writes.push_back({IoRequest::Op::kWrite, uint64_t(i) * kBlockBytes, bufs.back()->span()});
  }
  ASSERT_TRUE(dev->Submit(writes).ok());
  Aligned back(kN * kBlockBytes);
  for (int i = 0; i < kN; ++i) {
    reads.push_back({IoRequest::Op::kRead, uint64_t(i) * kBlockBytes,
                     std::span<std::byte>(back.bytes + i * kBlockBytes, kBlockBytes)});
  }
  ASSERT_TRUE(dev->Submit(reads).ok());
  for (int i = 0; i < kN; ++i) {
    EXPECT_EQ(std::memcmp(back.bytes + i * kBlockBytes, bufs[i]->bytes, kBlockBytes), 0) << i;
  }
}

TEST_F(IoUringFileDeviceTest, ThreadsSubmitConcurrentlyOnTheirOwnRings) {
  auto dev = OpenOrDie(1 << 20);
  ASSERT_TRUE(dev);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      Aligned out(kBlockBytes), in(kBlockBytes);
      for (int i = 0; i < 20; ++i) {
        const uint64_t off = uint64_t(t * 20 + i) * kBlockBytes;
        Fill(out.span(), static_cast<uint8_t>(t * 31 + i));
        if (!dev->Submit(std::vector<IoRequest>{{IoRequest::Op::kWrite, off, out.span()}}).ok() ||
            !dev->Submit(std::vector<IoRequest>{{IoRequest::Op::kRead, off, in.span()}}).ok() ||
            std::memcmp(out.bytes, in.bytes, kBlockBytes) != 0) {
          ++failures;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

// An anonymous mapping, as the DRAM arena is (memfd or anonymous memory).
struct Mapping {
  explicit Mapping(size_t n) : size(n) {
    void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    bytes = p == MAP_FAILED ? nullptr : static_cast<std::byte*>(p);
  }
  ~Mapping() {
    if (bytes) munmap(bytes, size);
  }
  std::span<std::byte> span(size_t off, size_t n) { return {bytes + off, n}; }
  std::byte* bytes;
  size_t size;
};

TEST_F(IoUringFileDeviceTest, CompletionCallbackSeesEveryRequestOnce) {
  auto dev = OpenOrDie(1 << 20, /*depth=*/4);
  ASSERT_TRUE(dev);
  constexpr int kN = 37;
  Aligned data(kN * kBlockBytes);
  Fill(data.span(), 3);
  std::vector<IoRequest> writes;
  for (int i = 0; i < kN; ++i) {
    writes.push_back({IoRequest::Op::kWrite, uint64_t(i) * kBlockBytes,
                      data.span().subspan(i * kBlockBytes, kBlockBytes)});
  }
  std::vector<int> seen(kN, 0);
  ASSERT_TRUE(dev->Submit(writes, [&](size_t i) { ++seen[i]; }).ok());
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), kN);

  // A reader's callback sees its request's bytes already in place.
  Aligned back(kN * kBlockBytes);
  std::vector<IoRequest> reads;
  for (int i = 0; i < kN; ++i) {
    reads.push_back({IoRequest::Op::kRead, uint64_t(i) * kBlockBytes,
                     back.span().subspan(i * kBlockBytes, kBlockBytes)});
  }
  int matching = 0;
  ASSERT_TRUE(dev->Submit(reads,
                          [&](size_t i) {
                            matching += std::memcmp(back.bytes + i * kBlockBytes,
                                                    data.bytes + i * kBlockBytes, kBlockBytes) == 0;
                          })
                  .ok());
  EXPECT_EQ(matching, kN);
}

TEST_F(IoUringFileDeviceTest, RegisteredBuffersRoundTripBesidePlainOnes) {
  auto dev = OpenOrDie(1 << 20, /*depth=*/4);
  ASSERT_TRUE(dev);
  Mapping arena(64 * kBlockBytes);
  ASSERT_NE(arena.bytes, nullptr);
  const std::span<std::byte> region = arena.span(0, arena.size);
  const Status st = dev->RegisterBuffers(std::span(&region, 1));
  if (st.code() == StatusCode::kResourceExhausted) GTEST_SKIP() << st.ToString();
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(dev->registered_buffer_bytes(), arena.size);

  // From the arena (fixed) and from a plain buffer, in one batch.
  Fill(arena.span(0, 8 * kBlockBytes), 9);
  Aligned plain(2 * kBlockBytes);
  Fill(plain.span(), 77);
  ASSERT_TRUE(
      dev->Submit(std::vector<IoRequest>{{IoRequest::Op::kWrite, 0, arena.span(0, 8 * kBlockBytes)},
                                         {IoRequest::Op::kWrite, 16 * kBlockBytes, plain.span()}})
          .ok());
  ASSERT_TRUE(dev->Sync().ok());
  std::memset(arena.bytes + 32 * kBlockBytes, 0, 10 * kBlockBytes);
  const std::vector<IoRequest> reads = {
      {IoRequest::Op::kRead, 0, arena.span(32 * kBlockBytes, 8 * kBlockBytes)},
      {IoRequest::Op::kRead, 16 * kBlockBytes, arena.span(40 * kBlockBytes, 2 * kBlockBytes)}};
  ASSERT_TRUE(dev->Submit(reads).ok());
  EXPECT_EQ(std::memcmp(arena.bytes + 32 * kBlockBytes, arena.bytes, 8 * kBlockBytes), 0);
  EXPECT_EQ(std::memcmp(arena.bytes + 40 * kBlockBytes, plain.bytes, 2 * kBlockBytes), 0);

  // Other threads register the buffers on their own rings as they submit.
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      const size_t off = (48 + 4 * t) * kBlockBytes;
      Fill(arena.span(off, kBlockBytes), static_cast<uint8_t>(t));
      Aligned in(kBlockBytes);
      const uint64_t at = uint64_t(100 + t) * kBlockBytes;
      const std::vector<IoRequest> write = {
          {IoRequest::Op::kWrite, at, arena.span(off, kBlockBytes)}};
      if (!dev->Submit(write).ok() ||
          !dev->Submit(std::vector<IoRequest>{{IoRequest::Op::kRead, at, in.span()}}).ok() ||
          std::memcmp(in.bytes, arena.bytes + off, kBlockBytes) != 0) {
        ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);

  // Unregistering leaves I/O from the same memory working.
  ASSERT_TRUE(dev->RegisterBuffers({}).ok());
  EXPECT_EQ(dev->registered_buffer_bytes(), 0u);
  std::memset(arena.bytes + 32 * kBlockBytes, 0, 8 * kBlockBytes);
  ASSERT_TRUE(dev->Submit(std::span(reads).first(1)).ok());
  EXPECT_EQ(std::memcmp(arena.bytes + 32 * kBlockBytes, arena.bytes, 8 * kBlockBytes), 0);
}

TEST_F(IoUringFileDeviceTest, EmptyOrOverlappingRegionsAreRefused) {
  auto dev = OpenOrDie(1 << 20);
  ASSERT_TRUE(dev);
  Mapping arena(16 * kBlockBytes);
  ASSERT_NE(arena.bytes, nullptr);
  const std::vector<std::span<std::byte>> empty = {arena.span(0, 0)};
  EXPECT_EQ(dev->RegisterBuffers(empty).code(), StatusCode::kInvalidArgument);
  const std::vector<std::span<std::byte>> overlap = {arena.span(0, 8 * kBlockBytes),
                                                     arena.span(4 * kBlockBytes, 8 * kBlockBytes)};
  EXPECT_EQ(dev->RegisterBuffers(overlap).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(dev->registered_buffer_bytes(), 0u);
}

TEST_F(IoUringFileDeviceTest, MisalignedOrOutOfRangeRequestsAreRejectedBeforeAnyIo) {
  auto dev = OpenOrDie(64 * kBlockBytes);
  ASSERT_TRUE(dev);
  Aligned buf(2 * kBlockBytes);
  const std::vector<std::vector<IoRequest>> bad = {
      {{IoRequest::Op::kWrite, 100, buf.span().first(kBlockBytes)}},
      {{IoRequest::Op::kWrite, 0, buf.span().first(100)}},
      {{IoRequest::Op::kWrite, 0, buf.span().subspan(8, kBlockBytes)}},
      {{IoRequest::Op::kRead, 63 * kBlockBytes, buf.span()}},
  };
  for (const auto& b : bad) {
    EXPECT_EQ(dev->Submit(b).code(), StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(dev->counters().writes.load() + dev->counters().reads.load(), 0u);
}

TEST_F(IoUringFileDeviceTest, StartUpErrorsNameTheProblem) {
  auto missing = IoUringFileDevice::Open({(dir_ / "nope" / "slots.dat").string(), 1 << 20, 4, {}});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("does not exist"), std::string::npos);

  std::FILE* f = std::fopen((dir_ / "plain").c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  auto not_dir = IoUringFileDevice::Open({(dir_ / "plain" / "slots.dat").string(), 1 << 20, 4, {}});
  ASSERT_FALSE(not_dir.ok());
  EXPECT_NE(not_dir.status().message().find("not a directory"), std::string::npos);

  struct statvfs vfs {};
  ASSERT_EQ(statvfs(dir_.c_str(), &vfs), 0);
  const uint64_t too_big = (uint64_t{vfs.f_bavail} * vfs.f_frsize + (uint64_t{1} << 30)) & ~4095ULL;
  auto full = IoUringFileDevice::Open({(dir_ / "huge.dat").string(), too_big, 4, {}});
  ASSERT_FALSE(full.ok());
  EXPECT_NE(full.status().message().find("free"), std::string::npos) << full.status().message();
  EXPECT_FALSE(fs::exists(dir_ / "huge.dat")) << "a refused file was left behind";

  auto odd = IoUringFileDevice::Open({(dir_ / "odd.dat").string(), 1000, 4, {}});
  EXPECT_EQ(odd.status().code(), StatusCode::kInvalidArgument);
}

TEST_F(IoUringFileDeviceTest, TmpfsIsRefusedWithItsReason) {
  // /dev/shm is tmpfs on Linux: RAM, not a disk (recent kernels take O_DIRECT on it).
  struct statfs info {};
  if (statfs("/dev/shm", &info) != 0 || static_cast<uint64_t>(info.f_type) != TMPFS_MAGIC) {
    GTEST_SKIP() << "/dev/shm is not tmpfs here";
  }
  const std::string path = "/dev/shm/kvtier-tmpfs-" + std::to_string(getpid());
  auto d = IoUringFileDevice::Open({path, 1 << 20, 4, {}});
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(d.status().message().find("tmpfs"), std::string::npos) << d.status().message();
  EXPECT_FALSE(fs::exists(path)) << "a refused start leaves no file";
}

TEST_F(IoUringFileDeviceTest, ASlotFileHasOneOwner) {
  auto first = OpenOrDie(1 << 20);
  ASSERT_TRUE(first);
  const std::string path = (dir_ / "slots.dat").string();
  auto second = IoUringFileDevice::Open({path, 1 << 20, 4, {}});
  ASSERT_FALSE(second.ok()) << "the same file opened twice";
  EXPECT_NE(second.status().message().find("in use"), std::string::npos)
      << second.status().message();
  first.reset();
  auto again = IoUringFileDevice::Open({path, 1 << 20, 4, {}});
  EXPECT_TRUE(again.ok()) << "free once the owner closed it: " << again.status().ToString();
}

TEST_F(IoUringFileDeviceTest, InjectedWriteFaultIsAnIoErrorAndLaterReadsStillWork) {
  auto dev = OpenOrDie(1 << 20);
  ASSERT_TRUE(dev);
  testing::FaultInjectionDevice faulty(*dev, /*good_writes=*/2);
  Aligned a(kBlockBytes), back(kBlockBytes);
  Fill(a.span(), 1);
  std::vector<IoRequest> three = {{IoRequest::Op::kWrite, 0, a.span()},
                                  {IoRequest::Op::kWrite, kBlockBytes, a.span()},
                                  {IoRequest::Op::kWrite, 2 * kBlockBytes, a.span()}};
  const Status st = faulty.Submit(three);
  EXPECT_EQ(st.code(), StatusCode::kIOError);
  EXPECT_EQ(faulty.counters().errors.load(), 1u);
  ASSERT_TRUE(
      faulty.Submit(std::vector<IoRequest>{{IoRequest::Op::kRead, kBlockBytes, back.span()}}).ok());
  EXPECT_EQ(std::memcmp(a.bytes, back.bytes, kBlockBytes), 0) << "the second write had succeeded";
}

}  // namespace
}  // namespace kvtier
