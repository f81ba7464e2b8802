#include "nvme.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "bench_common.h"
#include "kvtier/daemon/cache_core.h"
#include "kvtier/slot_image.h"
#include "kvtier/tiers/nvme_tier.h"
#include "kvtier/tiers/staging_buffer.h"
#include "kvtier/tiers/write_pipeline.h"
#include "kvtier/units.h"

namespace kvtier::bench {
namespace {

// Runs fio on `file` and returns its bandwidth in bytes/s, or -1. `fixed_bufs`:
// io_uring registered buffers and file (what the tier uses when it could
// register its buffers). `sync_every`: writes between fdatasyncs (0: none).
double Fio(const std::string& file, const char* rw, uint64_t block_bytes, uint64_t file_bytes,
           int seconds, bool fixed_bufs, size_t sync_every) {
  const std::string out = file + ".fio.json";
  std::string cmd =
      "fio --name=kvtier --filename=" + file + " --rw=" + rw +
      " --bs=" + std::to_string(block_bytes) + " --iodepth=32 --ioengine=io_uring" +
      " --direct=1 --size=" + std::to_string(file_bytes) +
      (fixed_bufs ? " --fixedbufs=1 --registerfiles=1" : "") +
      " --runtime=" + std::to_string(seconds) + " --time_based --group_reporting" +
      (sync_every > 0 ? " --fdatasync=" + std::to_string(sync_every) : std::string()) +
      " --output-format=json --output=" + out + " > /dev/null 2>&1";
  if (std::system(cmd.c_str()) != 0) return -1;
  std::ifstream in(out);
  auto j = nlohmann::json::parse(in, nullptr, false);
  std::filesystem::remove(out);
  if (j.is_discarded()) return -1;
  const char* side = std::string(rw).find("write") != std::string::npos ? "write" : "read";
  return j["jobs"][0][side]["bw_bytes"].get<double>();
}

// Writes every block of `file` (`bytes` long) once and syncs it, so that
// neither side measures first writes into fallocated (unwritten) extents,
// whose conversion costs ext4/XFS metadata work, nor reads of unwritten
// extents, which return zeros without touching the disk.
void Prefill(const std::string& file, uint64_t bytes) {
  const int fd = open(file.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) Die("open " + file + ": " + std::strerror(errno));
  constexpr uint64_t kChunk = uint64_t{4} << 20;
  std::unique_ptr<std::byte, decltype(&std::free)> zeros(
      static_cast<std::byte*>(std::aligned_alloc(4096, kChunk)), &std::free);
  std::memset(zeros.get(), 0, kChunk);
  for (uint64_t off = 0; off < bytes; off += kChunk) {
    const uint64_t n = std::min(kChunk, bytes - off);
    if (pwrite(fd, zeros.get(), n, static_cast<off_t>(off)) != static_cast<ssize_t>(n)) {
      Die("prefill " + file + ": " + std::strerror(errno));
    }
  }
  if (fdatasync(fd) != 0) Die("fdatasync " + file + ": " + std::strerror(errno));
  close(fd);
}

// An anonymous mapping, the bench's stand-in for the DRAM arena.
struct Arena {
  explicit Arena(uint64_t n) : bytes(n) {
    void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) Die("mmap " + std::to_string(n) + " bytes");
    base = static_cast<std::byte*>(p);
  }
  ~Arena() { munmap(base, bytes); }
  std::byte* base;
  uint64_t bytes;
};

}  // namespace

int RunNvme(const std::string& dir, uint64_t file_bytes, int seconds, bool plain_buffers) {
  namespace fs = std::filesystem;
  // The tier warns that the prefilled slot file has no index beside it: true, and meant.
  spdlog::set_level(spdlog::level::err);
  std::printf(
      "kvtier-bench nvme: NvmeTier vs fio (io_uring, O_DIRECT, depth 32) on the same %s "
      "file in %s, every block written once before either side runs\n"
      "  writes: the tier in its steady state (each chunk evicts the least recently "
      "written: slots reused in ascending order), timed with the writer's copy and "
      "checksum, in the writer's batches (up to 256 chunks and 64 MiB: data, fdatasync, "
      "RocksDB), each batch copied while the one before it is written, as kvtierd's "
      "writer does; fio sequential, fdatasync after as many writes, plain buffers\n"
      "  reads: random stored chunks, verified; fio randread\n",
      kvtier::FormatBytes(file_bytes).c_str(), dir.c_str());
  std::printf("%-10s %10s %8s %10s %7s %13s %10s %10s %7s\n", "payload", "write GB/s", "prepare",
              "fio GB/s", "ratio", "fio randwrite", "read GB/s", "fio GB/s", "ratio");
  bool registered_all = !plain_buffers;
  const auto remove_own = [&] {
    std::error_code ec;
    fs::remove(dir + "/kvtier-slots.dat", ec);
    fs::remove_all(dir + "/index", ec);
  };
  for (uint64_t payload : {256 * kvtier::kKiB, kvtier::kMiB, 4 * kvtier::kMiB}) {
    // Only what the tier and fio make here is removed: the directory may hold other files.
    const std::string file = dir + "/kvtier-slots.dat";
    remove_own();
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) Die("--dir " + dir + ": " + ec.message());
    Prefill(file, file_bytes);
    kvtier::NvmeTierOptions o;
    o.paths = {dir};
    o.bytes_per_path = file_bytes;
    o.queue_depth = 32;
    auto tier = Must(kvtier::NvmeTier::Open(o), "open NVMe tier");
    const auto spec = BenchSpec(payload, "bench-nvme");
    const kvtier::SlotLayout layout = kvtier::SlotLayout::For(spec);
    const kvtier::NamespaceId ns = spec.Digest();
    // The fill pass takes every slot, so each chunk of the timed pass evicts one.
    const uint64_t num_chunks = file_bytes / layout.slot_bytes;
    // Writes: one durable batch (data, fdatasync, index) as the daemon's writer takes it
    // with its default 1 GiB arena: up to 256 chunks and 64 MiB (and one slot).
    // A batch never takes over half the tier: its chunks evict only earlier ones (a
    // 64 MiB file held 248 slots of 256 KiB chunks, and a 249-chunk batch could not fit).
    if (num_chunks < 2) {
      Die("--file-bytes " + kvtier::FormatBytes(file_bytes) + " holds fewer than 2 slots of " +
          kvtier::FormatBytes(layout.slot_bytes));
    }
    const size_t batch = std::min<uint64_t>(
        {kvtier::CacheCore::kDestageBatchChunks,
         kvtier::CacheCore::kDestageBatchBytes / layout.slot_bytes + 1, num_chunks / 2});
    // Reads: up to 256 MiB of images per ReadMany, so the 32-deep queue stays full.
    const size_t read_batch =
        std::max<size_t>(batch, std::min<uint64_t>(256, (256 << 20) / layout.slot_bytes));
    // The stand-in for the DRAM arena: room for a whole pass (about --file-bytes), so that
    // the clients' commits of a pass are laid out before it and its timing holds only the
    // writer's own work. Reads land in its first read_batch slots, which are registered
    // with the tier as the arena would be.
    Arena arena(std::max<uint64_t>(read_batch, num_chunks) * layout.slot_bytes);
    std::memset(arena.base, 0x5a, arena.bytes);
    const auto buf = [&](size_t i) { return arena.base + i * layout.slot_bytes; };
    if (!plain_buffers) {
      const std::span<std::byte> region(arena.base, read_batch * layout.slot_bytes);
      const kvtier::Status st = tier->RegisterBuffers(std::span(&region, 1));
      if (!st.ok()) {
        std::printf("(buffers not registered: %s)\n", st.ToString().c_str());
        registered_all = false;
      }
    }
    const bool fixed = !plain_buffers && registered_all;
    // Chunk c of the fill pass (untimed) and of the timed pass (c >= num_chunks).
    std::printf("%-10s (%zu chunks a write batch)\n", kvtier::FormatBytes(payload).c_str(), batch);
    std::vector<std::vector<int32_t>> tokens(2 * num_chunks);
    std::vector<kvtier::ChunkKey> keys(2 * num_chunks);
    kvtier::StagingBuffer staging[2];
    double write_s = 0, prepare_s = 0;  // prepare: the copies and checksums
    for (uint64_t first = 0; first < 2 * num_chunks; first += num_chunks) {
      for (uint64_t i = 0; i < num_chunks; ++i) {  // what the clients' commits leave in the arena
        const uint64_t c = first + i;
        tokens[c] = UniquePrompt(c + 1, spec.chunk_tokens);
        keys[c] = kvtier::ComputeChunkKey(ns, tokens[c]);
        kvtier::SealSlot(buf(i), layout, {ns, keys[c], ns, tokens[c]}, c + 1,
                         /*with_payload_checksum=*/false);
      }
      // The daemon's writer (Destager::WriteBatches): each batch copied out of the arena
      // into a staging buffer and checksummed while the batch before it is written.
      struct Batch {
        std::vector<kvtier::NvmeImage> images;
      };
      uint64_t next = 0;
      double pass_prepare_s = 0;
      std::string write_error;  // set by a write (the calling thread), read after the pipeline
      std::atomic<bool> write_failed{false};  // read by the prepares beside the writes
      const auto t0 = Clock::now();
      kvtier::WritePipelined<Batch>(
          staging, SIZE_MAX,
          [&](kvtier::StagingBuffer& s) -> std::optional<Batch> {
            if (next >= num_chunks || write_failed.load()) return std::nullopt;
            const auto tp = Clock::now();
            const size_t n = std::min<uint64_t>(batch, num_chunks - next);
            std::byte* copy = s.Reserve(n * layout.slot_bytes);
            Batch b;
            for (size_t i = 0; i < n; ++i, copy += layout.slot_bytes) {
              std::memcpy(copy, buf(next + i), layout.slot_bytes);
              kvtier::SealPayloadChecksum(copy, layout);
              b.images.push_back({keys[first + next + i], ns, ns, {copy, layout.slot_bytes}});
            }
            next += n;
            pass_prepare_s += Seconds(Clock::now() - tp);
            return b;
          },
          [&](Batch& b) {
            kvtier::Result<size_t> stored = tier->Write(b.images);
            if (!stored.ok()) {
              write_error = "NVMe write: " + stored.status().ToString();
            } else if (*stored != b.images.size()) {
              write_error = "the NVMe tier stored " + std::to_string(*stored) + " of " +
                            std::to_string(b.images.size());
            }
            if (!write_error.empty()) write_failed.store(true);
          });
      const double pass_s = Seconds(Clock::now() - t0);
      if (!write_error.empty()) Die(write_error);
      if (first >= num_chunks) {
        write_s = pass_s;
        prepare_s = pass_prepare_s;
      }
    }
    const uint64_t timed_chunks = num_chunks;
    // Reads of random chunks of the timed pass (those resident): every chunk's worth at
    // least, and as long as fio runs.
    std::mt19937_64 rng(42);
    double read_s = 0;
    uint64_t reads = 0;
    std::vector<kvtier::NvmeTier::ReadRequest> reqs(read_batch);
    while (reads < num_chunks || read_s < seconds) {
      for (size_t i = 0; i < read_batch; ++i) {
        const uint64_t c = num_chunks + rng() % num_chunks;
        reqs[i] = {{ns, keys[c], ns, tokens[c]},
                   &layout,
                   {buf(i), layout.slot_bytes},
                   kvtier::Status::Ok()};
      }
      const auto t0 = Clock::now();
      kvtier::Status st = tier->ReadMany(reqs);
      read_s += Seconds(Clock::now() - t0);
      if (!st.ok()) Die("NVMe read: " + st.ToString());
      for (const auto& r : reqs) {
        if (!r.result.ok()) Die("NVMe read verification: " + r.result.ToString());
      }
      reads += read_batch;
    }
    tier.reset();
    const double fio_read = Fio(file, "randread", layout.slot_bytes, file_bytes, seconds, fixed, 0);
    const double fio_write =
        Fio(file, "write", layout.slot_bytes, file_bytes, seconds, false, batch);
    const double fio_randwrite =
        Fio(file, "randwrite", layout.slot_bytes, file_bytes, seconds, false, batch);
    const double w = static_cast<double>(timed_chunks * layout.slot_bytes) / write_s;
    const double r = static_cast<double>(reads * layout.slot_bytes) / read_s;
    std::printf("%-10s %10.2f %7.0f%% %10.2f %7.2f %13.2f %10.2f %10.2f %7.2f\n",
                kvtier::FormatBytes(payload).c_str(), w / 1e9, 100 * prepare_s / write_s,
                fio_write / 1e9, fio_write > 0 ? w / fio_write : 0.0, fio_randwrite / 1e9, r / 1e9,
                fio_read / 1e9, fio_read > 0 ? r / fio_read : 0.0);
  }
  remove_own();
  std::printf(
      "(prepare: the time spent copying and checksumming, as a share of the write "
      "time it runs beside; "
      "GB/s = 1e9 bytes/s of whole slot images; reads verify header and XXH3 checksum; "
      "read buffers %s; fio -1 = fio failed; goal ratio >= 0.9)\n",
      plain_buffers    ? "plain (per-I/O pinning) on both sides"
      : registered_all ? "registered with io_uring on both sides (fio --fixedbufs)"
                       : "registered where the kernel allowed (see above)");
  return 0;
}

}  // namespace kvtier::bench
