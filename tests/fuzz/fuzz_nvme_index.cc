// Fuzz target: NVMe index records as a start reads them: NvmeIndex::DecodeRecord
// (kvtier/tiers/nvme_index.h) and the records the tier then keeps (NvmeTier::UsableRecords,
// what NvmeTier::Create's rebuild applies).
//
// Input (FuzzedDataProvider):
//   1. a raw key and value for DecodeRecord;
//   2. 1..3 devices of 1..31 blocks, and up to 24 records with fuzzed fields: keys from a
//      small set (so parents can name other records), parents, devices, offsets and slot
//      sizes in or out of range, aligned or not, sequences, access times;
//   3. for 1 input in 32, the same through RocksDB (in memory) and NvmeTier::Create, then up
//      to 8 new images written (about 40 ms an input, so only a few).
// Checks, besides ASan/UBSan:
//   - DecodeRecord refuses with DATA_LOSS, or returns what EncodeRecord turns back into the
//     same key and value; every record encodes and decodes to itself;
//   - the kept records are ones the tier can serve: inside a device, 4 KiB aligned, not
//     overlapping, each one's parents kept up to its namespace (no orphans, no cycles); a
//     dropped record breaks one of those rules;
//   - through RocksDB: the tier keeps such records, its counters (chunks, used bytes, dropped
//     at start, max sequence) match; after images are sealed at the kept records' places,
//     new writes land elsewhere (every chunk it holds reads back verified); a restart over the
//     same disks and index drops nothing more.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fuzz_check.h"
#include "kvtier/slot_image.h"
#include "kvtier/tiers/nvme_tier.h"
#include "memory_nvme.h"

namespace {

using kvtier::ChunkKey;
using kvtier::NvmeRecord;
using kvtier::fuzz::MemoryBlockDevice;
using kvtier::fuzz::MemoryDisk;

constexpr uint64_t kBlock = kvtier::kBlockBytes;
const ChunkKey kNs[2] = {{0x5151, 1}, {0x5252, 2}};

ChunkKey KeyOf(uint32_t id) { return {0x1000 + id, 0xFEED}; }

// The image layout of a slot of `slot_bytes` (a multiple of 4 KiB): 4 tokens.
kvtier::SlotLayout LayoutOf(uint64_t slot_bytes) { return {4, 256, slot_bytes - 256, slot_bytes}; }

std::vector<int32_t> TokensOf(const ChunkKey& key) {
  const auto t = static_cast<int32_t>(key.lo & 0xFFFF);
  return {t, t + 1, t + 2, t + 3};
}

// A sealed image, 4 KiB aligned as NVMe writes need.
std::unique_ptr<MemoryDisk> SealedImage(const ChunkKey& key, const ChunkKey& parent,
                                        const ChunkKey& ns, uint64_t slot_bytes,
                                        uint64_t sequence) {
  auto image = std::make_unique<MemoryDisk>(slot_bytes);
  for (size_t i = 256; i < slot_bytes; ++i) {
    image->data()[i] = std::byte(static_cast<uint8_t>(i ^ key.lo));
  }
  const std::vector<int32_t> tokens = TokensOf(key);
  kvtier::SealSlot(image->data(), LayoutOf(slot_bytes), {ns, key, parent, tokens}, sequence);
  return image;
}

void CheckDecode(FuzzedDataProvider& in) {
  const std::string key = in.ConsumeRandomLengthString(40);
  const std::string value = in.ConsumeRandomLengthString(80);
  const auto decoded = kvtier::NvmeIndex::DecodeRecord(key, value);
  if (!decoded.ok()) {
    FUZZ_CHECK(decoded.status().code() == kvtier::StatusCode::kDataLoss,
               "a malformed record is not DATA_LOSS");
    return;
  }
  const auto [k, v] = kvtier::NvmeIndex::EncodeRecord(*decoded);
  FUZZ_CHECK(k == key && v == value, "a decoded record encodes to other bytes");
}

struct Disks {
  std::vector<std::shared_ptr<MemoryDisk>> disks;
  std::vector<uint64_t> Bytes() const {
    std::vector<uint64_t> out;
    for (const auto& d : disks) out.push_back(d->bytes());
    return out;
  }
  std::vector<std::unique_ptr<kvtier::BlockDevice>> Devices() const {
    std::vector<std::unique_ptr<kvtier::BlockDevice>> out;
    for (const auto& d : disks) out.push_back(std::make_unique<MemoryBlockDevice>(d));
    return out;
  }
};

bool KeyLess(const ChunkKey& a, const ChunkKey& b) {
  return a.lo != b.lo ? a.lo < b.lo : a.hi < b.hi;
}
using RecordMap = std::map<ChunkKey, NvmeRecord, bool (*)(const ChunkKey&, const ChunkKey&)>;

// Whether a record could be served at all: inside its device, 4 KiB aligned.
bool InPlace(const NvmeRecord& r, const Disks& disks) {
  return r.device < disks.disks.size() && r.offset % kBlock == 0 && r.slot_bytes % kBlock == 0 &&
         r.slot_bytes > 0 && r.offset <= disks.disks[r.device]->bytes() &&
         r.slot_bytes <= disks.disks[r.device]->bytes() - r.offset;
}

bool Overlap(const NvmeRecord& a, const NvmeRecord& b) {
  return a.device == b.device && a.offset < b.offset + b.slot_bytes &&
         b.offset < a.offset + a.slot_bytes;
}

// Whether r's parents lead, through records of `kept`, to its namespace.
bool Rooted(const NvmeRecord& r, const RecordMap& kept) {
  const NvmeRecord* at = &r;
  for (size_t steps = 0; at->parent != at->ns; ++steps) {
    auto parent = kept.find(at->parent);
    if (parent == kept.end() || steps > kept.size()) return false;  // an orphan, or a cycle
    at = &parent->second;
  }
  return true;
}

// Every record of `kept` is servable, disjoint from the others and rooted; and every record
// of `all` left out breaks one of those rules (it is not in place, overlaps another one in
// place, or is not rooted through the kept ones).
void CheckKept(const RecordMap& kept, const RecordMap& all, const Disks& disks) {
  for (const auto& [key, r] : kept) {
    FUZZ_CHECK(InPlace(r, disks), "a kept record is outside its device or not 4 KiB aligned");
    FUZZ_CHECK(Rooted(r, kept), "a kept record's parents do not lead to its namespace");
    for (const auto& [other_key, other] : kept) {
      FUZZ_CHECK(other_key == key || !Overlap(r, other), "two kept records overlap");
    }
  }
  for (const auto& [key, r] : all) {
    if (kept.count(key) != 0 || !InPlace(r, disks) || !Rooted(r, kept)) continue;
    bool overlaps = false;
    for (const auto& [other_key, other] : all) {
      overlaps = overlaps || (!(other_key == key) && InPlace(other, disks) && Overlap(r, other));
    }
    FUZZ_CHECK(overlaps, "a servable record was dropped");
  }
}

NvmeRecord ConsumeRecord(FuzzedDataProvider& in) {
  NvmeRecord r;
  r.key = KeyOf(in.ConsumeIntegralInRange(0, 15));
  r.ns = kNs[in.ConsumeIntegralInRange(0, 1)];
  const uint32_t parent = in.ConsumeIntegralInRange(0, 20);
  r.parent = parent < 16 ? KeyOf(parent) : r.ns;
  switch (in.ConsumeIntegralInRange(0, 7)) {
    case 0:  // fields anywhere
      r.device = in.ConsumeIntegral<uint32_t>();
      r.offset = in.ConsumeIntegral<uint64_t>();
      r.slot_bytes = in.ConsumeIntegral<uint64_t>();
      break;
    case 1:  // in range, not aligned
      r.device = in.ConsumeIntegralInRange(0, 2);
      r.offset = in.ConsumeIntegralInRange<uint64_t>(0, 32 * kBlock);
      r.slot_bytes = in.ConsumeIntegralInRange<uint64_t>(0, 3 * kBlock);
      break;
    default:
      r.device = in.ConsumeIntegralInRange(0, 2);
      r.offset = kBlock * in.ConsumeIntegralInRange(0, 32);
      r.slot_bytes = kBlock * in.ConsumeIntegralInRange(1, 3);
  }
  r.sequence = in.ConsumeIntegral<uint64_t>();
  r.payload_checksum = in.ConsumeIntegral<uint64_t>();
  r.last_access_ms = in.ConsumeIntegralInRange<uint64_t>(0, 4);
  const auto [k, v] = kvtier::NvmeIndex::EncodeRecord(r);
  auto decoded = kvtier::NvmeIndex::DecodeRecord(k, v);
  FUZZ_CHECK(decoded.ok(), "an encoded record does not decode");
  decoded->last_access_ms = r.last_access_ms;  // kept under its own key
  FUZZ_CHECK(*decoded == r, "a record decodes to another");
  return r;
}

// The records through RocksDB and NvmeTier::Create, new writes, reads and a restart.
void ThroughTheTier(FuzzedDataProvider& in, const std::vector<NvmeRecord>& records,
                    const RecordMap& final_records, const Disks& disks) {
  kvtier::fuzz::MemoryIndexDir dir;
  uint64_t chunks_after_writes = 0;
  {
    auto index = dir.Open();
    FUZZ_CHECK(index.ok(), "the in-memory index does not open");
    FUZZ_CHECK((*index)->Put(records).ok(), "the in-memory index refused records");
    auto tier = kvtier::NvmeTier::Create(disks.Devices(), std::move(*index));
    FUZZ_CHECK(tier.ok(), "the tier refused well-formed records");
    kvtier::NvmeTier& t = **tier;
    RecordMap kept(KeyLess);
    uint64_t used = 0, max_sequence = 0;
    for (const auto& [key, r] : final_records) {
      max_sequence = std::max(max_sequence, r.sequence);
      if (!t.Contains(key)) continue;
      kept.emplace(key, r);
      used += r.slot_bytes;
    }
    CheckKept(kept, final_records, disks);
    const kvtier::NvmeTierCounters c = t.counters();
    FUZZ_CHECK(c.chunks == kept.size() && c.used_bytes == used, "counters differ from the kept");
    FUZZ_CHECK(c.dropped_at_start == final_records.size() - kept.size(),
               "dropped_at_start differs from the records dropped");
    FUZZ_CHECK(t.max_sequence() == max_sequence, "max_sequence is not the records' highest");

    // Images where the kept records say, then new writes: none may land on another's bytes.
    for (const auto& [key, r] : kept) {
      const auto image = SealedImage(key, r.parent, r.ns, r.slot_bytes, r.sequence);
      std::memcpy(disks.disks[r.device]->data() + r.offset, image->data(), image->bytes());
    }
    struct Held {
      ChunkKey key, parent, ns;
      uint64_t slot_bytes;
    };
    std::vector<Held> held;  // every chunk the tier may hold
    for (const auto& [key, r] : kept) held.push_back({key, r.parent, r.ns, r.slot_bytes});
    std::vector<std::unique_ptr<MemoryDisk>> images;
    const uint32_t num_writes = in.ConsumeIntegralInRange(0, 8);
    for (uint32_t w = 0; w < num_writes; ++w) {
      // Its parent: a record's key (kept or not), an earlier new image, or its namespace.
      const uint32_t pick = in.ConsumeIntegralInRange(0, 31);
      const ChunkKey ns = kNs[pick % 2];
      const ChunkKey parent = pick < 16 ? KeyOf(pick) : pick < 16 + w ? KeyOf(100 + pick - 16) : ns;
      const uint64_t slot_bytes = kBlock * in.ConsumeIntegralInRange(1, 2);
      held.push_back({KeyOf(100 + w), parent, ns, slot_bytes});
      images.push_back(SealedImage(KeyOf(100 + w), parent, ns, slot_bytes, max_sequence + 1));
    }
    std::vector<kvtier::NvmeImage> writes;
    for (size_t w = 0; w < images.size(); ++w) {
      const Held& h = held[kept.size() + w];
      writes.push_back({h.key, h.parent, h.ns, {images[w]->data(), images[w]->bytes()}});
    }
    FUZZ_CHECK(t.Write(writes).ok(), "a write to the in-memory tier failed");
    for (const Held& h : held) {
      if (!t.Contains(h.key)) continue;
      ++chunks_after_writes;
      MemoryDisk buffer(h.slot_bytes);  // 4 KiB aligned, as reads need
      const std::vector<int32_t> tokens = TokensOf(h.key);
      const kvtier::Status read = t.Read({h.ns, h.key, h.parent, tokens}, LayoutOf(h.slot_bytes),
                                         {buffer.data(), h.slot_bytes});
      FUZZ_CHECK(read.ok(), "a chunk the tier holds does not read back (overwritten?)");
    }
    FUZZ_CHECK(t.counters().chunks == chunks_after_writes, "chunks differs from what reads back");
  }
  // A restart over the same disks and index: everything held is kept.
  auto index = dir.Open();
  FUZZ_CHECK(index.ok(), "the in-memory index does not reopen");
  auto tier = kvtier::NvmeTier::Create(disks.Devices(), std::move(*index));
  FUZZ_CHECK(tier.ok(), "the tier does not reopen");
  FUZZ_CHECK((*tier)->counters().dropped_at_start == 0, "a restart dropped records it had kept");
  FUZZ_CHECK((*tier)->counters().chunks == chunks_after_writes, "a restart holds other chunks");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  CheckDecode(in);
  const bool through_tier = kvtier::fuzz::RocksDbPathNow(in.ConsumeIntegralInRange(0, 31) == 0);
  Disks disks;
  const int num_devices = in.ConsumeIntegralInRange(1, 3);
  for (int d = 0; d < num_devices; ++d) {
    disks.disks.push_back(std::make_shared<MemoryDisk>(kBlock * in.ConsumeIntegralInRange(1, 31)));
  }
  std::vector<NvmeRecord> records(in.ConsumeIntegralInRange(0, 24));
  for (NvmeRecord& r : records) r = ConsumeRecord(in);
  // What the index holds: the last record of each key (one write batch), read back in key
  // order and sorted by access time, as the tier's start does.
  RecordMap final_records(KeyLess);
  for (const NvmeRecord& r : records) final_records.insert_or_assign(r.key, r);
  std::vector<NvmeRecord> at_start;
  for (const auto& [key, r] : final_records) at_start.push_back(r);
  std::stable_sort(at_start.begin(), at_start.end(), [](const NvmeRecord& a, const NvmeRecord& b) {
    return a.last_access_ms < b.last_access_ms;
  });
  const std::vector<bool> usable = kvtier::NvmeTier::UsableRecords(at_start, disks.Bytes());
  FUZZ_CHECK(usable.size() == at_start.size(), "not one verdict per record");
  RecordMap kept(KeyLess);
  for (size_t i = 0; i < at_start.size(); ++i) {
    if (usable[i]) kept.emplace(at_start[i].key, at_start[i]);
  }
  CheckKept(kept, final_records, disks);
  if (through_tier) ThroughTheTier(in, records, final_records, disks);
  return 0;
}
