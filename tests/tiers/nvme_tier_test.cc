// NvmeTier on real O_DIRECT files and a real RocksDB index: restart recovery,
// corruption is a counted miss, leaf-first eviction, injected EIO.
#include "kvtier/tiers/nvme_tier.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "kvtier/tiers/io_uring_file_device.h"
#include "slot_chain.h"
#include "testing/fault_injection_device.h"

namespace kvtier {
namespace {

namespace fs = std::filesystem;

NamespaceSpec Spec() {
  NamespaceSpec s;
  s.model_id = "nvme-test";
  s.num_layers = 2;
  s.num_kv_heads = 1;
  s.head_dim = 64;
  s.chunk_tokens = 16;  // 8 KiB payload, 12 KiB slot
  return s;
}

class NvmeTierTest : public ::testing::Test {
 protected:
  NvmeTierTest() : dir_(fs::current_path() / ("nvme-tier-" + std::to_string(getpid()))) {
    fs::create_directories(dir_);
  }
  ~NvmeTierTest() override { fs::remove_all(dir_); }

  std::unique_ptr<NvmeTier> OpenTier(uint64_t bytes) {
    NvmeTierOptions o;
    o.paths = {dir_.string()};
    o.bytes_per_path = bytes;
    o.queue_depth = 8;
    auto t = NvmeTier::Open(o);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return t.ok() ? std::move(t).value() : nullptr;
  }

  fs::path dir_;
  const NamespaceSpec spec_ = Spec();
  const SlotLayout layout_ = SlotLayout::For(Spec());
};

TEST_F(NvmeTierTest, ImagesComeBackWithTheSameBytesAfterReopen) {
  Chain c(spec_, 1, 6);
  {
    auto tier = OpenTier(1 << 20);
    ASSERT_TRUE(tier);
    auto n = tier->Write(c.Images());
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    EXPECT_EQ(*n, 6u);
  }
  auto tier = OpenTier(1 << 20);
  ASSERT_TRUE(tier);
  EXPECT_EQ(tier->counters().chunks, 6u);
  EXPECT_EQ(tier->counters().dropped_at_start, 0u);
  AlignedBuf buf(layout_.slot_bytes);
  for (size_t i = 0; i < 6; ++i) {
    ASSERT_TRUE(tier->Read(c.Id(i), layout_, buf.span()).ok()) << i;
    EXPECT_EQ(std::memcmp(buf.p + layout_.header_bytes, c.images[i]->p + layout_.header_bytes,
                          layout_.payload_bytes),
              0)
        << i;
  }
}

TEST_F(NvmeTierTest, FlippedByteOnDiskIsACountedMissNeverServed) {
  Chain c(spec_, 2, 1);
  {
    auto tier = OpenTier(1 << 20);
    ASSERT_TRUE(tier);
    ASSERT_TRUE(tier->Write(c.Images()).ok());
  }
  // The first slot of an empty file is at offset 0.
  const std::string file = (dir_ / "kvtier-slots.dat").string();
  const int fd = open(file.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char byte;
  ASSERT_EQ(pread(fd, &byte, 1, layout_.header_bytes + 5), 1);
  byte ^= 0x20;
  ASSERT_EQ(pwrite(fd, &byte, 1, layout_.header_bytes + 5), 1);
  fsync(fd);
  close(fd);

  auto tier = OpenTier(1 << 20);
  ASSERT_TRUE(tier);
  AlignedBuf buf(layout_.slot_bytes);
  EXPECT_EQ(tier->Read(c.Id(0), layout_, buf.span()).code(), StatusCode::kDataLoss);
  EXPECT_EQ(tier->counters().corrupt_reads, 1u);
  EXPECT_FALSE(tier->Contains(c.keys[0]));
  tier.reset();
  tier = OpenTier(1 << 20);
  EXPECT_FALSE(tier->Contains(c.keys[0])) << "the bad record came back after a restart";
}

TEST_F(NvmeTierTest, RegisteredArenaBuffersWriteAndReadVerifiedImages) {
  Chain c(spec_, 5, 4);
  auto tier = OpenTier(1 << 20);
  ASSERT_TRUE(tier);
  // The images and the read buffers in one registered region, as the DRAM
  // arena would be.
  const size_t n = 8 * layout_.slot_bytes;
  AlignedBuf arena(n);
  const std::span<std::byte> region = arena.span();
  const Status reg = tier->RegisterBuffers(std::span(&region, 1));
  if (reg.code() == StatusCode::kResourceExhausted) GTEST_SKIP() << reg.ToString();
  ASSERT_TRUE(reg.ok()) << reg.ToString();
  std::vector<NvmeImage> images = c.Images();
  for (size_t i = 0; i < images.size(); ++i) {
    std::memcpy(arena.p + i * layout_.slot_bytes, c.images[i]->p, layout_.slot_bytes);
    images[i].image = {arena.p + i * layout_.slot_bytes, layout_.slot_bytes};
  }
  auto stored = tier->Write(images);
  ASSERT_TRUE(stored.ok()) << stored.status().ToString();
  EXPECT_EQ(*stored, 4u);
  std::memset(arena.p + 4 * layout_.slot_bytes, 0, 4 * layout_.slot_bytes);
  std::vector<NvmeTier::ReadRequest> reads;
  for (size_t i = 0; i < 4; ++i) {
    reads.push_back({c.Id(i),
                     &layout_,
                     {arena.p + (4 + i) * layout_.slot_bytes, layout_.slot_bytes},
                     Status::Ok()});
  }
  ASSERT_TRUE(tier->ReadMany(reads).ok());
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_TRUE(reads[i].result.ok()) << i << ": " << reads[i].result.ToString();
    EXPECT_EQ(
        std::memcmp(arena.p + (4 + i) * layout_.slot_bytes, c.images[i]->p, layout_.slot_bytes), 0)
        << i;
  }
  // A wrong identity still fails verification through the registered path.
  std::vector<NvmeTier::ReadRequest> wrong = {
      {c.Id(1), &layout_, {arena.p + 4 * layout_.slot_bytes, layout_.slot_bytes}, Status::Ok()}};
  wrong[0].id.tokens = c.Id(2).tokens;
  ASSERT_TRUE(tier->ReadMany(wrong).ok());
  EXPECT_FALSE(wrong[0].result.ok());
}

TEST_F(NvmeTierTest, ReadWithWrongTokensIsAMiss) {
  Chain c(spec_, 3, 1);
  auto tier = OpenTier(1 << 20);
  ASSERT_TRUE(tier);
  ASSERT_TRUE(tier->Write(c.Images()).ok());
  std::vector<int32_t> other(c.tokens.begin(), c.tokens.begin() + 16);
  other[3] += 1;
  SlotIdentity id = c.Id(0);
  id.tokens = other;
  AlignedBuf buf(layout_.slot_bytes);
  EXPECT_EQ(tier->Read(id, layout_, buf.span()).code(), StatusCode::kDataLoss);
}

TEST_F(NvmeTierTest, FullTierEvictsLeavesFirst) {
  // Room for exactly three slots.
  auto tier = OpenTier(3 * layout_.slot_bytes);
  ASSERT_TRUE(tier);
  Chain a(spec_, 4, 3);
  ASSERT_EQ(*tier->Write(a.Images()), 3u);
  Chain b(spec_, 5, 1);
  ASSERT_EQ(*tier->Write(b.Images()), 1u);
  EXPECT_TRUE(tier->Contains(a.keys[0]));
  EXPECT_TRUE(tier->Contains(a.keys[1]));
  EXPECT_FALSE(tier->Contains(a.keys[2])) << "the leaf goes first";
  EXPECT_TRUE(tier->Contains(b.keys[0]));
  EXPECT_EQ(tier->counters().evictions, 1u);
}

// Issue 10, item 9: access times were never persisted, so after a restart the
// LRU order was the index's key order. Three one-chunk prompts: the one with
// the largest key is written second and never read, so it is the LRU victim;
// in key order it would be the last one evicted.
TEST_F(NvmeTierTest, LruOrderSurvivesARestart) {
  std::vector<Chain> c;
  for (uint32_t s = 0; s < 3; ++s) c.emplace_back(spec_, 40 + s, 1);
  std::sort(c.begin(), c.end(), [](const Chain& a, const Chain& b) {
    return a.keys[0].ToBytes() < b.keys[0].ToBytes();  // the index's key order
  });
  Chain& smallest = c[0];
  Chain& middle = c[1];
  Chain& victim = c[2];
  {
    auto tier = OpenTier(3 * layout_.slot_bytes);
    ASSERT_TRUE(tier);
    for (Chain* w : {&smallest, &victim, &middle}) {
      ASSERT_EQ(*tier->Write(w->Images()), 1u);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));  // distinct write times
    }
    AlignedBuf buf(layout_.slot_bytes);
    ASSERT_TRUE(tier->Read(smallest.Id(0), layout_, buf.span()).ok());
    ASSERT_TRUE(tier->PersistAccessTimes().ok());
  }
  auto tier = OpenTier(3 * layout_.slot_bytes);
  ASSERT_TRUE(tier);
  ASSERT_EQ(tier->counters().chunks, 3u);
  Chain fourth(spec_, 50, 1);
  ASSERT_EQ(*tier->Write(fourth.Images()), 1u);
  EXPECT_FALSE(tier->Contains(victim.keys[0])) << "the least recently used chunk goes first";
  EXPECT_TRUE(tier->Contains(smallest.keys[0]));
  EXPECT_TRUE(tier->Contains(middle.keys[0]));
}

TEST_F(NvmeTierTest, OrphanWithoutItsParentIsNotWritten) {
  auto tier = OpenTier(1 << 20);
  ASSERT_TRUE(tier);
  Chain c(spec_, 6, 2);
  auto images = c.Images();
  EXPECT_EQ(*tier->Write(std::span(images).subspan(1)), 0u);
  EXPECT_FALSE(tier->Contains(c.keys[1]));
}

TEST_F(NvmeTierTest, InjectedWriteErrorIndexesNothingAndFreesTheSlots) {
  auto inner = IoUringFileDevice::Open({(dir_ / "slots.dat").string(), 1 << 20, 8, {}});
  ASSERT_TRUE(inner.ok());
  auto faulty = std::make_unique<testing::FaultInjectionDevice>(**inner, /*good_writes=*/1);
  auto* faulty_raw = faulty.get();
  std::vector<std::unique_ptr<BlockDevice>> devices;
  devices.push_back(std::move(faulty));
  auto index = NvmeIndex::Open((dir_ / "index").string());
  ASSERT_TRUE(index.ok());
  auto tier = NvmeTier::Create(std::move(devices), std::move(index).value());
  ASSERT_TRUE(tier.ok());
  Chain c(spec_, 7, 3);
  auto w = (*tier)->Write(c.Images());
  EXPECT_EQ(w.status().code(), StatusCode::kIOError);
  EXPECT_EQ((*tier)->counters().chunks, 0u);
  EXPECT_EQ((*tier)->counters().used_bytes, 0u);
  faulty_raw->set_good_writes(100);
  EXPECT_EQ(*(*tier)->Write(c.Images()), 3u);
}

}  // namespace
}  // namespace kvtier

namespace kvtier {
namespace {

// Reads that wait for one another: each read Submit returns only once `n` reads are in, so
// that `n` concurrent ReadMany calls all hold their pins before any of them ends.
class ReadsTogetherDevice final : public BlockDevice {
 public:
  ReadsTogetherDevice(BlockDevice& inner, int n)
      : BlockDevice(inner.bytes()), inner_(inner), n_(n) {}

 protected:
  Status SubmitImpl(std::span<const IoRequest> batch) override {
    if (!batch.empty() && batch[0].op == IoRequest::Op::kRead) {
      std::unique_lock lock(mu_);
      ++arrived_;
      cv_.notify_all();
      cv_.wait_for(lock, std::chrono::seconds(10), [&] { return arrived_ >= n_; });
    }
    return inner_.Submit(batch);
  }
  Status SyncImpl() override { return inner_.Sync(); }

 private:
  BlockDevice& inner_;
  const int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
};

// Two workers promoting the same prompt read the same corrupt chunk at once. The first to
// finish erased it while the second still held it, and the second then unpinned and erased
// a freed (or reused) handle: the chunk count ran twice down, the handle went twice onto
// the free list, and two later chunks shared one handle.
TEST_F(NvmeTierTest, TwoReadsOfOneCorruptChunkAtOnceDropItOnce) {
  Chain c(spec_, 9, 2);
  auto inner = IoUringFileDevice::Open({(dir_ / "slots.dat").string(), 1 << 20, 8, {}});
  ASSERT_TRUE(inner.ok());
  std::vector<std::unique_ptr<BlockDevice>> devices;
  devices.push_back(std::make_unique<ReadsTogetherDevice>(**inner, 2));
  auto index = NvmeIndex::Open((dir_ / "index").string());
  ASSERT_TRUE(index.ok());
  auto tier = NvmeTier::Create(std::move(devices), std::move(index).value());
  ASSERT_TRUE(tier.ok());
  ASSERT_EQ(*(*tier)->Write(c.Images()), 2u);
  {  // chunk 1 (a leaf, the second slot) gets a flipped payload byte
    const int fd = open((dir_ / "slots.dat").c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    const off_t at = static_cast<off_t>(layout_.slot_bytes + layout_.header_bytes + 5);
    char byte;
    ASSERT_EQ(pread(fd, &byte, 1, at), 1);
    byte ^= 0x20;
    ASSERT_EQ(pwrite(fd, &byte, 1, at), 1);
    fsync(fd);
    close(fd);
  }
  Status results[2];
  auto read = [&](int t) {
    AlignedBuf buf(layout_.slot_bytes);
    results[t] = (*tier)->Read(c.Id(1), layout_, buf.span());
  };
  std::thread a(read, 0), b(read, 1);
  a.join();
  b.join();
  EXPECT_EQ(results[0].code(), StatusCode::kDataLoss);
  EXPECT_EQ(results[1].code(), StatusCode::kDataLoss);
  EXPECT_FALSE((*tier)->Contains(c.keys[1]));
  EXPECT_TRUE((*tier)->Contains(c.keys[0]));
  EXPECT_EQ((*tier)->counters().chunks, 1u);
  EXPECT_EQ((*tier)->counters().used_bytes, layout_.slot_bytes);
  // The freed slot and handle are whole again: two new chunks take them, apart.
  Chain d(spec_, 10, 2);
  ASSERT_EQ(*(*tier)->Write(d.Images()), 2u);
  EXPECT_EQ((*tier)->counters().chunks, 3u);
  AlignedBuf buf(layout_.slot_bytes);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_TRUE((*tier)->Read(d.Id(i), layout_, buf.span()).ok()) << i;  // (reads pass alone now)
  }
  EXPECT_TRUE((*tier)->Read(c.Id(0), layout_, buf.span()).ok());
}

// A start must leave room for the index beside the slot files: on a 56 MiB file system with
// 32 MiB of slots, the index once filled the disk and kvtierd could not start again. The file
// system's free bytes come through the hook, wrapped to report less than there is.
TEST_F(NvmeTierTest, StartIsRefusedWhenTheSlotFileAndTheIndexHeadroomDoNotFit) {
  constexpr uint64_t kBytes = 32 << 20;
  const uint64_t needed = kBytes + NvmeIndex::HeadroomBytes(kBytes);
  NvmeTierOptions o;
  o.paths = {dir_.string()};
  o.bytes_per_path = kBytes;
  o.queue_depth = 8;
  uint64_t reported = needed - 4096;
  o.free_bytes = [&reported](const std::string& dir) -> Result<uint64_t> {
    struct statvfs vfs {};
    if (statvfs(dir.c_str(), &vfs) != 0) return Status::FromErrno(errno, "statvfs " + dir);
    return std::min<uint64_t>(reported, uint64_t{vfs.f_bavail} * vfs.f_frsize);
  };
  auto refused = NvmeTier::Open(o);
  ASSERT_FALSE(refused.ok()) << "the index's headroom did not fit, yet the tier opened";
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  const std::string& msg = refused.status().message();
  EXPECT_NE(msg.find(dir_.string()), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(needed)), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(reported)), std::string::npos) << msg;
  EXPECT_NE(msg.find("index"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(dir_ / "kvtier-slots.dat")) << "a refused start left its slot file";
  EXPECT_FALSE(fs::exists(dir_ / "index")) << "a refused start left its index";

  reported = needed;  // exactly enough
  auto tier = NvmeTier::Open(o);
  ASSERT_TRUE(tier.ok()) << tier.status().ToString();
  tier->reset();
  // A restart counts the slot file and the index already there as the space they hold.
  reported = NvmeIndex::HeadroomBytes(kBytes);
  auto again = NvmeTier::Open(o);
  EXPECT_TRUE(again.ok()) << again.status().ToString();
}

TEST_F(NvmeTierTest, LostIndexIsRebuiltFromSlotHeaders) {
  Chain a(spec_, 8, 4);
  Chain big_spec_chain(
      [] {
        NamespaceSpec s = Spec();
        s.chunk_tokens = 4096;  // ~1 MiB slots: the scan's 4 MiB windows end inside one of them
        s.num_layers = 1;
        return s;
      }(),
      9, 5);
  {
    auto tier = OpenTier(16 << 20);
    ASSERT_TRUE(tier);
    ASSERT_EQ(*tier->Write(a.Images()), 4u);
    ASSERT_EQ(*tier->Write(big_spec_chain.Images()), 5u);
  }
  fs::remove_all(dir_ / "index");
  {
    auto dev = IoUringFileDevice::Open({(dir_ / "kvtier-slots.dat").string(), 16 << 20, 8, {}});
    ASSERT_TRUE(dev.ok());
    auto index = NvmeIndex::Open((dir_ / "index").string());
    ASSERT_TRUE(index.ok());
    BlockDevice* devs[] = {dev->get()};
    auto n = NvmeTier::RebuildIndexFromSlots(devs, **index);
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    EXPECT_EQ(*n, 9u);
  }
  auto tier = OpenTier(16 << 20);
  ASSERT_TRUE(tier);
  EXPECT_EQ(tier->counters().chunks, 9u);
  AlignedBuf buf(big_spec_chain.layout.slot_bytes);
  for (size_t i = 0; i < 4; ++i) EXPECT_TRUE(tier->Read(a.Id(i), a.layout, buf.span()).ok()) << i;
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_TRUE(tier->Read(big_spec_chain.Id(i), big_spec_chain.layout, buf.span()).ok()) << i;
  }
}

// Found by fuzz_rebuild_index: a chunk whose parent chain never reaches its namespace (it is
// its own parent, or two chunks are each other's) can never be looked up, and it never
// leaves: each counts as its parent's resident child, so leaf-first eviction skips it.
TEST_F(NvmeTierTest, RecordsInAParentCycleAreDroppedAtStart) {
  const NamespaceId ns = spec_.Digest();
  const ChunkKey a{1, 1}, b{2, 2}, c{3, 3}, root{4, 4};
  const uint64_t slot = layout_.slot_bytes;
  {
    auto index = NvmeIndex::Open((dir_ / "index").string());
    ASSERT_TRUE(index.ok()) << index.status().ToString();
    const std::vector<NvmeRecord> records = {
        {a, a, ns, 0, 0, slot, 1, 0, 0},     // its own parent
        {b, c, ns, 0, slot, slot, 2, 0, 0},  // b and c: each other's parent
        {c, b, ns, 0, 2 * slot, slot, 3, 0, 0},
        {root, ns, ns, 0, 3 * slot, slot, 4, 0, 0},  // a first chunk: kept
    };
    ASSERT_TRUE((*index)->Put(records).ok());
  }
  auto tier = OpenTier(1 << 20);
  ASSERT_TRUE(tier);
  EXPECT_EQ(tier->counters().dropped_at_start, 3u);
  EXPECT_EQ(tier->counters().chunks, 1u);
  EXPECT_EQ(tier->counters().used_bytes, slot);
  EXPECT_FALSE(tier->Contains(a));
  EXPECT_FALSE(tier->Contains(b));
  EXPECT_FALSE(tier->Contains(c));
  EXPECT_TRUE(tier->Contains(root));
}

// Found by fuzz_nvme_index: a record at an offset or of a size that is not a multiple of
// 4 KiB was kept at start; its slot could never be read (O_DIRECT), and the free extents
// around it were misaligned, so every write the allocator placed there failed.
TEST_F(NvmeTierTest, MisalignedRecordsAreDroppedAtStart) {
  const NamespaceId ns = spec_.Digest();
  {
    auto index = NvmeIndex::Open((dir_ / "index").string());
    ASSERT_TRUE(index.ok()) << index.status().ToString();
    const std::vector<NvmeRecord> records = {
        {{1, 1}, ns, ns, 0, 100, layout_.slot_bytes, 1, 0, 0},        // offset not aligned
        {{2, 2}, ns, ns, 0, 65536, layout_.slot_bytes + 1, 2, 0, 0},  // size not aligned
    };
    ASSERT_TRUE((*index)->Put(records).ok());
  }
  auto tier = OpenTier(1 << 20);
  ASSERT_TRUE(tier);
  EXPECT_EQ(tier->counters().dropped_at_start, 2u);
  EXPECT_EQ(tier->counters().chunks, 0u);
  Chain c(spec_, 5, 8);
  auto n = tier->Write(c.Images());
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, 8u);
  AlignedBuf buf(layout_.slot_bytes);
  for (size_t i = 0; i < 8; ++i) EXPECT_TRUE(tier->Read(c.Id(i), layout_, buf.span()).ok()) << i;
}

}  // namespace
}  // namespace kvtier
