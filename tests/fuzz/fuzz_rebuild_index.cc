// Fuzz target: `kvtierd --rebuild-index` over arbitrary slot files: the scan of every
// device's slot headers (NvmeTier::ScanSlots, what NvmeTier::RebuildIndex runs over the real
// files before it writes the index) and the records a tier then keeps
// (NvmeTier::UsableRecords). Devices are in memory (memory_nvme.h).
//
// Input (FuzzedDataProvider): 1..2 devices of 1..31 blocks (below 128 KiB, which ASan maps
// and unmaps on each allocation), then up to 16 placements, each
//   - a sealed image (1..16 tokens, 1 B..12 KiB of payload, key, parent and namespace from
//     small sets, any sequence) at any block, or
//   - raw bytes at any byte offset (garbage, a torn header), or
//   - a few flipped bytes;
// whether reads fail (a failing disk); and, for 1 input in 32, the whole path: the index
// written in RocksDB (in memory), the tier opened from it, every chunk it keeps read back.
// Checks, besides ASan/UBSan:
//   - the scan returns IO_ERROR on a failing disk and succeeds otherwise;
//   - every record it returns points, inside its device, at an image whose header and
//     payload verify and match the record (key, parent, namespace, slot size, sequence,
//     checksum); records do not overlap; one per key;
//   - every placed image that is still intact is found: its key's record is it, or one with
//     a higher sequence;
//   - the tier keeps every record whose parents lead to its namespace, and drops the others;
//   - the whole path writes those records, and what the tier keeps reads back verified.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "fuzz_check.h"
#include "kvtier/slot_image.h"
#include "kvtier/tiers/nvme_tier.h"
#include "kvtier/units.h"
#include "memory_nvme.h"

namespace {

using kvtier::ChunkKey;
using kvtier::NvmeRecord;
using kvtier::SlotHeader;
using kvtier::fuzz::MemoryBlockDevice;
using kvtier::fuzz::MemoryDisk;

constexpr uint64_t kBlock = kvtier::kBlockBytes;

ChunkKey KeyOf(uint32_t id) { return {0x2000 + id, 0xBEEF}; }
ChunkKey NsOf(uint32_t id) { return {0x7070 + id, 7}; }

struct Placed {
  uint32_t device;
  uint64_t offset;
  ChunkKey key;
  uint64_t sequence;
  std::vector<std::byte> image;
};

std::vector<std::byte> Seal(FuzzedDataProvider& in, ChunkKey* key, uint64_t* sequence) {
  kvtier::SlotLayout layout;
  layout.chunk_tokens = in.ConsumeIntegralInRange<uint32_t>(1, 16);
  layout.header_bytes = static_cast<uint32_t>(
      kvtier::AlignUp(sizeof(SlotHeader) + 4ULL * layout.chunk_tokens, kvtier::kPayloadAlignment));
  layout.payload_bytes = in.ConsumeIntegralInRange<uint64_t>(1, 3 * kBlock);
  layout.slot_bytes = kvtier::AlignUp(layout.header_bytes + layout.payload_bytes, kBlock);
  *key = KeyOf(in.ConsumeIntegralInRange(0, 7));
  const ChunkKey ns = NsOf(in.ConsumeIntegralInRange(0, 1));
  const uint32_t parent = in.ConsumeIntegralInRange(0, 11);
  const ChunkKey parent_key = parent < 8 ? KeyOf(parent) : ns;
  *sequence = in.ConsumeIntegral<uint64_t>();
  std::vector<int32_t> tokens(layout.chunk_tokens);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(key->lo + i);
  std::vector<std::byte> image(layout.slot_bytes, std::byte{0});
  for (uint64_t i = 0; i < layout.payload_bytes; ++i) {
    image[layout.header_bytes + i] = std::byte(static_cast<uint8_t>(i * 7 + key->lo));
  }
  kvtier::SealSlot(image.data(), layout, {ns, *key, parent_key, tokens}, *sequence);
  return image;
}

// The layout and identity an image's own header describes (what the scan trusts).
struct Described {
  kvtier::SlotLayout layout;
  SlotHeader header;
  std::vector<int32_t> tokens;
};

Described Describe(const std::byte* slot, uint64_t slot_bytes) {
  Described d;
  std::memcpy(&d.header, slot, sizeof(SlotHeader));
  d.layout = {d.header.num_tokens, d.header.header_bytes, d.header.payload_bytes, slot_bytes};
  d.tokens.resize(d.header.num_tokens);
  std::memcpy(d.tokens.data(), slot + sizeof(SlotHeader), 4ULL * d.header.num_tokens);
  return d;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  std::vector<std::shared_ptr<MemoryDisk>> disks;
  const int num_devices = in.ConsumeIntegralInRange(1, 2);
  for (int d = 0; d < num_devices; ++d) {
    disks.push_back(std::make_shared<MemoryDisk>(kBlock * in.ConsumeIntegralInRange(1, 31)));
  }
  const bool failing = in.ConsumeIntegralInRange(0, 31) == 0;
  std::vector<Placed> placed;
  const int placements = in.ConsumeIntegralInRange(0, 16);
  for (int p = 0; p < placements; ++p) {
    const uint32_t d = in.ConsumeIntegralInRange<uint32_t>(0, num_devices - 1);
    MemoryDisk& disk = *disks[d];
    switch (in.ConsumeIntegralInRange(0, 2)) {
      case 0: {  // a sealed image at a block
        Placed img{d,
                   kBlock * in.ConsumeIntegralInRange<uint64_t>(0, disk.bytes() / kBlock - 1),
                   {},
                   0,
                   {}};
        img.image = Seal(in, &img.key, &img.sequence);
        if (img.image.size() > disk.bytes() - img.offset) break;
        std::memcpy(disk.data() + img.offset, img.image.data(), img.image.size());
        placed.push_back(std::move(img));
        break;
      }
      case 1: {  // raw bytes anywhere
        const uint64_t at = in.ConsumeIntegralInRange<uint64_t>(0, disk.bytes() - 1);
        const std::string raw = in.ConsumeRandomLengthString(512);
        std::memcpy(disk.data() + at, raw.data(),
                    std::min<uint64_t>(raw.size(), disk.bytes() - at));
        break;
      }
      default: {  // flipped bytes
        for (int f = in.ConsumeIntegralInRange(1, 4); f > 0; --f) {
          disk.data()[in.ConsumeIntegralInRange<uint64_t>(0, disk.bytes() - 1)] ^=
              std::byte{in.ConsumeIntegralInRange<uint8_t>(1, 255)};
        }
      }
    }
  }

  std::vector<std::unique_ptr<kvtier::BlockDevice>> devices;
  std::vector<kvtier::BlockDevice*> raw_devices;
  for (const auto& disk : disks) {
    auto dev = std::make_unique<MemoryBlockDevice>(disk);
    dev->fail_reads = failing;
    raw_devices.push_back(dev.get());
    devices.push_back(std::move(dev));
  }
  const bool through_tier = kvtier::fuzz::RocksDbPathNow(in.ConsumeIntegralInRange(0, 31) == 0);
  const kvtier::Result<std::vector<NvmeRecord>> scanned = kvtier::NvmeTier::ScanSlots(raw_devices);
  if (failing) {
    FUZZ_CHECK(!scanned.ok() && scanned.status().code() == kvtier::StatusCode::kIOError,
               "a failing disk is not an IO_ERROR");
    return 0;
  }
  FUZZ_CHECK(scanned.ok(), "the scan of readable devices failed");
  const std::vector<NvmeRecord>& records = *scanned;
  std::map<std::pair<uint32_t, uint64_t>, uint64_t> extents;
  std::map<std::pair<uint64_t, uint64_t>, const NvmeRecord*> by_key;
  for (const NvmeRecord& r : records) {
    FUZZ_CHECK(r.device < disks.size(), "a record names no device");
    const MemoryDisk& disk = *disks[r.device];
    FUZZ_CHECK(r.offset % kBlock == 0 && r.slot_bytes % kBlock == 0 && r.slot_bytes > 0 &&
                   r.offset < disk.bytes() && r.slot_bytes <= disk.bytes() - r.offset,
               "a record is misaligned or past its device's end");
    const std::byte* slot = disks[r.device]->data() + r.offset;
    const Described d = Describe(slot, r.slot_bytes);
    FUZZ_CHECK(kvtier::VerifySlotHeader(slot, d.layout, {r.ns, r.key, r.parent, d.tokens}).ok() &&
                   kvtier::VerifySlotPayload(slot, d.layout).ok(),
               "a record points at an image that does not verify");
    FUZZ_CHECK(
        r.slot_bytes == kvtier::AlignUp(d.header.header_bytes + d.header.payload_bytes, kBlock) &&
            r.sequence == d.header.sequence && r.payload_checksum == d.header.payload_checksum,
        "a record differs from its image's header");
    FUZZ_CHECK(extents.emplace(std::pair{r.device, r.offset}, r.slot_bytes).second,
               "two records at one place");
    FUZZ_CHECK(by_key.emplace(std::pair{r.key.lo, r.key.hi}, &r).second, "two records of a key");
  }
  uint32_t last_device = UINT32_MAX;
  uint64_t end = 0;
  for (const auto& [where, bytes] : extents) {
    if (where.first != last_device) end = 0;
    FUZZ_CHECK(where.second >= end, "two records overlap");
    last_device = where.first;
    end = where.second + bytes;
  }
  for (const Placed& p : placed) {
    if (std::memcmp(disks[p.device]->data() + p.offset, p.image.data(), p.image.size()) != 0) {
      continue;  // overwritten by a later placement
    }
    auto r = by_key.find({p.key.lo, p.key.hi});
    FUZZ_CHECK(r != by_key.end(), "an intact image was not found");
    FUZZ_CHECK(r->second->sequence >= p.sequence, "an older image won over a newer one");
  }

  // Kept: exactly the records whose parents lead, through kept records, to their namespace.
  std::vector<uint64_t> device_bytes;
  for (const auto& disk : disks) device_bytes.push_back(disk->bytes());
  const std::vector<bool> usable = kvtier::NvmeTier::UsableRecords(records, device_bytes);
  FUZZ_CHECK(usable.size() == records.size(), "not one verdict per record");
  for (size_t i = 0; i < records.size(); ++i) {
    const NvmeRecord* at = &records[i];
    bool rooted = true;
    for (size_t steps = 0; rooted && at->parent != at->ns; ++steps) {
      auto parent = by_key.find({at->parent.lo, at->parent.hi});
      rooted = parent != by_key.end() && steps <= records.size();
      if (rooted) at = parent->second;
    }
    FUZZ_CHECK(usable[i] == rooted, "a verified image is kept iff its prefix is there");
  }
  if (!through_tier) return 0;

  kvtier::fuzz::MemoryIndexDir dir;
  auto index = dir.Open();
  FUZZ_CHECK(index.ok(), "the in-memory index does not open");
  const kvtier::Result<size_t> written =
      kvtier::NvmeTier::RebuildIndexFromSlots(raw_devices, **index);
  FUZZ_CHECK(written.ok() && *written == records.size(), "the index got other records");
  auto tier = kvtier::NvmeTier::Create(std::move(devices), std::move(*index));
  FUZZ_CHECK(tier.ok(), "the tier does not open from a rebuilt index");
  for (size_t i = 0; i < records.size(); ++i) {
    const NvmeRecord& r = records[i];
    FUZZ_CHECK((*tier)->Contains(r.key) == usable[i], "the tier keeps other records");
    if (!usable[i]) continue;
    const Described d = Describe(disks[r.device]->data() + r.offset, r.slot_bytes);
    MemoryDisk buffer(r.slot_bytes);
    const kvtier::Status read =
        (*tier)->Read({r.ns, r.key, r.parent, d.tokens}, d.layout, {buffer.data(), r.slot_bytes});
    FUZZ_CHECK(read.ok(), "a chunk of the rebuilt tier does not read back");
  }
  return 0;
}
