#include "kvtier/tiers/nvme_tier.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <unordered_map>

#include "kvtier/tiers/io_uring_file_device.h"
#include "kvtier/units.h"

namespace kvtier {

NvmeTier::NvmeTier(std::vector<std::unique_ptr<BlockDevice>> devices,
                   std::unique_ptr<NvmeIndex> index, EvictionPolicyKind eviction)
    : devices_(std::move(devices)), index_(std::move(index)), policy_(NewEvictionPolicy(eviction)) {
  for (const auto& d : devices_) {
    allocators_.emplace_back(d->bytes());
    counters_.capacity_bytes += d->bytes();
  }
}

namespace {

uint64_t UnixMs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

// Bytes the file system has allocated to `path` (a file, or a directory's files), as df counts.
uint64_t AllocatedBytes(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  uint64_t bytes = 0;
  const auto add = [&bytes](const fs::path& p) {
    if (struct stat st{}; stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
      bytes += static_cast<uint64_t>(st.st_blocks) * 512;
    }
  };
  if (!fs::is_directory(path, ec)) {
    add(path);
    return bytes;
  }
  for (fs::recursive_directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
    add(it->path());
  }
  return bytes;
}

Result<uint64_t> StatvfsFreeBytes(const std::string& dir) {
  struct statvfs vfs {};
  if (statvfs(dir.c_str(), &vfs) != 0) return Status::FromErrno(errno, "statvfs " + dir);
  return uint64_t{vfs.f_bavail} * vfs.f_frsize;
}

// Refuses a start whose file systems cannot hold what the tier will take there: the slot
// files' bytes not yet allocated, and the index's headroom less what it holds already.
// Directories that do not exist are left to the opens after it to report.
Status CheckFreeSpace(const NvmeTierOptions& o, const std::filesystem::path& index_dir) {
  namespace fs = std::filesystem;
  struct Need {
    std::string dir;  // the first directory of the file system named
    uint64_t slot_bytes = 0, index_bytes = 0;
  };
  std::vector<std::pair<dev_t, Need>> needs;  // one per file system, in the order first met
  const auto need_at = [&needs](const fs::path& dir) -> Need* {
    struct stat st {};
    if (stat(dir.c_str(), &st) != 0) return nullptr;
    for (auto& [dev, need] : needs) {
      if (dev == st.st_dev) return &need;
    }
    return &needs.emplace_back(st.st_dev, Need{dir.string()}).second;
  };
  for (const std::string& path : o.paths) {
    const uint64_t have = AllocatedBytes(fs::path(path) / "kvtier-slots.dat");
    if (Need* n = need_at(path))
      n->slot_bytes += o.bytes_per_path > have ? o.bytes_per_path - have : 0;
  }
  // The index's directory may not exist yet: it lands on its nearest existing parent's disk.
  fs::path index_disk = index_dir;
  std::error_code ec;
  while (!fs::exists(index_disk, ec) && index_disk.has_parent_path() &&
         index_disk.parent_path() != index_disk) {
    index_disk = index_disk.parent_path();
  }
  const uint64_t headroom = NvmeIndex::HeadroomBytes(o.bytes_per_path * o.paths.size());
  const uint64_t index_has = AllocatedBytes(index_dir);
  if (Need* n = need_at(index_disk))
    n->index_bytes += headroom > index_has ? headroom - index_has : 0;
  for (const auto& [dev, n] : needs) {
    const uint64_t needed = n.slot_bytes + n.index_bytes;
    if (needed == 0) continue;
    auto free_bytes = o.free_bytes ? o.free_bytes(n.dir) : StatvfsFreeBytes(n.dir);
    if (!free_bytes.ok()) return free_bytes.status();
    if (*free_bytes >= needed) continue;
    return Status::InvalidArgument(
        "NVMe path " + n.dir + " has " + std::to_string(*free_bytes) + " bytes free (" +
        FormatBytes(*free_bytes) + "), fewer than the " + std::to_string(needed) + " (" +
        FormatBytes(needed) + ") the NVMe tier needs there: " + std::to_string(n.slot_bytes) +
        " for slot files (--nvme-bytes) and " + std::to_string(n.index_bytes) +
        " headroom for the NVMe index " + index_dir.string() +
        " (its log, flushes and records); free space there or give a smaller --nvme-bytes");
  }
  return Status::Ok();
}

}  // namespace

NvmeTier::~NvmeTier() {
  if (index_ && index_->failure().empty()) (void)PersistAccessTimes();
}

Status NvmeTier::PersistAccessTimes() {
  std::lock_guard lock(mu_);  // so that an eviction's delete cannot pass these puts
  if (dirty_access_.empty()) return Status::Ok();
  std::vector<std::pair<ChunkKey, uint64_t>> times(dirty_access_.begin(), dirty_access_.end());
  dirty_access_.clear();
  return index_->PutAccessTimes(times);
}

Result<std::unique_ptr<NvmeTier>> NvmeTier::Open(const NvmeTierOptions& options) {
  if (options.paths.empty()) return Status::InvalidArgument("no NVMe path given");
  namespace fs = std::filesystem;
  // What this call creates is removed again when it fails (a refused start
  // leaves nothing behind); what was there before is never touched.
  std::vector<fs::path> created;
  std::vector<std::unique_ptr<BlockDevice>> devices;
  bool any_slot_file_existed = false;
  const auto fail = [&](Status st) -> Result<std::unique_ptr<NvmeTier>> {
    devices.clear();  // closes the files (and their locks) first
    std::error_code ec;
    for (const fs::path& p : created) fs::remove_all(p, ec);
    return st;
  };
  const fs::path index_dir = options.index_dir.empty() ? fs::path(options.paths[0]) / "index"
                                                       : fs::path(options.index_dir);
  KVTIER_RETURN_IF_ERROR(CheckFreeSpace(options, index_dir));
  for (const std::string& path : options.paths) {
    const fs::path file = fs::path(path) / "kvtier-slots.dat";
    std::error_code ec;
    const bool existed = fs::exists(file, ec);
    auto d =
        IoUringFileDevice::Open({file.string(), options.bytes_per_path, options.queue_depth, {}});
    if (!d.ok()) return fail(d.status());
    if (!existed) created.push_back(file);
    any_slot_file_existed |= existed;
    devices.push_back(std::move(d).value());
  }
  std::error_code ec;
  if (!fs::exists(index_dir, ec)) {
    created.push_back(index_dir);
    if (any_slot_file_existed) {
      spdlog::warn(
          "NVMe index {} is missing beside existing slot files: starting with an empty "
          "index, so the chunks in the slot files are not served; restart with "
          "--rebuild-index to index them again from their slot headers",
          index_dir.string());
    }
  }
  auto index = NvmeIndex::Open(index_dir.string());
  if (!index.ok()) return fail(index.status());
  auto tier = Create(std::move(devices), std::move(index).value(), options.eviction);
  if (!tier.ok()) return fail(tier.status());
  return tier;
}

Result<std::unique_ptr<NvmeTier>> NvmeTier::Create(
    std::vector<std::unique_ptr<BlockDevice>> devices, std::unique_ptr<NvmeIndex> index,
    EvictionPolicyKind eviction) {
  if (devices.empty()) return Status::InvalidArgument("no NVMe device given");
  std::unique_ptr<NvmeTier> tier(new NvmeTier(std::move(devices), std::move(index), eviction));
  KVTIER_RETURN_IF_ERROR(tier->Rebuild());
  return tier;
}

Result<std::vector<NvmeRecord>> NvmeTier::ScanSlots(std::span<BlockDevice* const> devices) {
  constexpr uint64_t kScanBytes = uint64_t{4} << 20;  // read 4 MiB at a time
  std::unique_ptr<std::byte, decltype(&std::free)> buf(
      static_cast<std::byte*>(std::aligned_alloc(kBlockBytes, kScanBytes)), &std::free);
  std::unordered_map<ChunkKey, NvmeRecord, ChunkKeyHash> found;
  // Records the image at `slot` (device `d`, byte `offset`) when its header and
  // payload verify; the newest sequence wins for a key.
  const auto record = [&](const std::byte* slot, const SlotHeader& h, uint32_t d, uint64_t offset,
                          uint64_t slot_bytes) {
    const SlotLayout layout{h.num_tokens, h.header_bytes, h.payload_bytes, slot_bytes};
    const SlotIdentity id{
        ChunkKey::FromBytes(h.namespace_digest), ChunkKey::FromBytes(h.key),
        ChunkKey::FromBytes(h.parent_key),
        std::span<const int32_t>(reinterpret_cast<const int32_t*>(slot + sizeof(SlotHeader)),
                                 h.num_tokens)};
    if (!VerifySlotHeader(slot, layout, id).ok() || !VerifySlotPayload(slot, layout).ok()) {
      return false;
    }
    const NvmeRecord r{id.key,     id.parent,          id.ns, d, offset, slot_bytes,
                       h.sequence, h.payload_checksum, 0};
    auto [it, fresh] = found.emplace(r.key, r);
    if (!fresh && it->second.sequence < r.sequence) it->second = r;
    return true;
  };
  for (uint32_t d = 0; d < devices.size(); ++d) {
    BlockDevice& dev = *devices[d];
    uint64_t pos = 0;
    while (pos < dev.bytes()) {
      const uint64_t window = std::min(kScanBytes, dev.bytes() - pos);
      std::vector<IoRequest> req = {{IoRequest::Op::kRead, pos, {buf.get(), window}}};
      KVTIER_RETURN_IF_ERROR(dev.Submit(req));
      uint64_t off = 0;
      while (off < window) {
        SlotHeader h;
        std::memcpy(&h, buf.get() + off, sizeof(h));
        const uint64_t slot_bytes =
            AlignUp(uint64_t{h.header_bytes} + h.payload_bytes, kSlotAlignment);
        const bool plausible = h.magic == kSlotMagic && h.format_version == kSlotFormatVersion &&
                               h.header_bytes >= sizeof(SlotHeader) + 4ULL * h.num_tokens &&
                               h.header_bytes % kPayloadAlignment == 0 && h.payload_bytes > 0 &&
                               h.payload_bytes <= kMaxPayloadBytes &&
                               pos + off + slot_bytes <= dev.bytes();
        if (!plausible) {
          off += kBlockBytes;
          continue;
        }
        if (off + slot_bytes <= window) {
          off += record(buf.get() + off, h, d, pos + off, slot_bytes) ? slot_bytes : kBlockBytes;
          continue;
        }
        if (off == 0) {  // larger than the window: read the whole image on its own
          std::unique_ptr<std::byte, decltype(&std::free)> big(
              static_cast<std::byte*>(std::aligned_alloc(kBlockBytes, slot_bytes)), &std::free);
          std::vector<IoRequest> whole = {{IoRequest::Op::kRead, pos, {big.get(), slot_bytes}}};
          KVTIER_RETURN_IF_ERROR(dev.Submit(whole));
          off = record(big.get(), h, d, pos, slot_bytes) ? slot_bytes : kBlockBytes;
        }
        break;  // the next window starts at this image (or past it)
      }
      pos += off;
    }
  }
  std::vector<NvmeRecord> records;
  records.reserve(found.size());
  for (auto& [k, r] : found) records.push_back(r);
  return records;
}

Result<size_t> NvmeTier::RebuildIndexFromSlots(std::span<BlockDevice* const> devices,
                                               NvmeIndex& index) {
  Result<std::vector<NvmeRecord>> scanned = ScanSlots(devices);
  if (!scanned.ok()) return scanned.status();
  const std::vector<NvmeRecord>& records = *scanned;
  for (size_t i = 0; i < records.size(); i += 4096) {
    const size_t n = std::min<size_t>(4096, records.size() - i);
    KVTIER_RETURN_IF_ERROR(index.Put(std::span<const NvmeRecord>(records.data() + i, n)));
  }
  return records.size();
}

Result<size_t> NvmeTier::RebuildIndex(const NvmeTierOptions& options) {
  if (options.paths.empty()) return Status::InvalidArgument("no NVMe path given");
  const std::string index_dir =
      options.index_dir.empty() ? options.paths[0] + "/index" : options.index_dir;
  // Every slot file opened (and locked) first: a start refused there (another
  // kvtierd holds it, a smaller size) must not have removed the index.
  std::vector<std::unique_ptr<IoUringFileDevice>> devices;
  std::vector<BlockDevice*> raw;
  for (const std::string& path : options.paths) {
    auto d = IoUringFileDevice::Open(
        {path + "/kvtier-slots.dat", options.bytes_per_path, options.queue_depth, {}});
    if (!d.ok()) return d.status();
    raw.push_back(d->get());
    devices.push_back(std::move(d).value());
  }
  std::error_code ec;
  std::filesystem::remove_all(index_dir, ec);
  if (ec) return Status::IOError("remove NVMe index " + index_dir + ": " + ec.message());
  auto index = NvmeIndex::Open(index_dir);
  if (!index.ok()) return index.status();
  return RebuildIndexFromSlots(raw, **index);
}

std::vector<bool> NvmeTier::UsableRecords(std::span<const NvmeRecord> records,
                                          std::span<const uint64_t> device_bytes) {
  std::vector<bool> usable(records.size(), false);
  // Extents in one pass per device: sort the records' ranges by offset. A slot that is not
  // 4 KiB aligned could never be read (O_DIRECT), and would misalign the free extents.
  for (uint32_t d = 0; d < device_bytes.size(); ++d) {
    std::vector<size_t> order;
    for (size_t i = 0; i < records.size(); ++i) {
      const NvmeRecord& r = records[i];
      if (r.device == d && r.offset % kBlockBytes == 0 && r.slot_bytes % kBlockBytes == 0) {
        order.push_back(i);
      }
    }
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return records[a].offset < records[b].offset; });
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    ranges.reserve(order.size());
    for (size_t i : order) ranges.emplace_back(records[i].offset, records[i].slot_bytes);
    const std::vector<bool> taken = SlotAllocator(device_bytes[d]).ReserveSorted(ranges);
    for (size_t k = 0; k < order.size(); ++k) usable[order[k]] = taken[k];
  }
  // One record per key (the first), then only those whose parents lead to their namespace:
  // a walk down from the first chunks leaves out orphans and parent cycles alike (a chunk
  // that is its own ancestor would never be evicted: it counts as its parent's child).
  std::unordered_map<ChunkKey, size_t, ChunkKeyHash> by_key;
  for (size_t i = 0; i < records.size(); ++i) {
    if (usable[i] && !by_key.emplace(records[i].key, i).second) usable[i] = false;
  }
  std::unordered_map<ChunkKey, std::vector<size_t>, ChunkKeyHash> children;
  std::vector<size_t> reached;
  for (const auto& [key, i] : by_key) {
    const NvmeRecord& r = records[i];
    if (r.parent == r.ns) {
      reached.push_back(i);
    } else {
      children[r.parent].push_back(i);
    }
  }
  std::vector<bool> rooted(records.size(), false);
  while (!reached.empty()) {  // each record has one parent: reached at most once
    const size_t i = reached.back();
    reached.pop_back();
    rooted[i] = true;
    if (auto it = children.find(records[i].key); it != children.end()) {
      for (size_t c : it->second) reached.push_back(c);
    }
  }
  return rooted;
}

Status NvmeTier::Rebuild() {
  std::vector<NvmeRecord> records;
  KVTIER_RETURN_IF_ERROR(index_->ForEach([&](const NvmeRecord& r) { records.push_back(r); }));
  // Oldest first: each insert becomes the most recent, so LRU order follows
  // the persisted access times.
  std::sort(records.begin(), records.end(), [](const NvmeRecord& a, const NvmeRecord& b) {
    return a.last_access_ms < b.last_access_ms;
  });
  std::vector<uint64_t> device_bytes;
  for (const auto& d : devices_) device_bytes.push_back(d->bytes());
  const std::vector<bool> usable = UsableRecords(records, device_bytes);
  std::lock_guard lock(mu_);
  for (const NvmeRecord& r : records) max_sequence_ = std::max(max_sequence_, r.sequence);
  for (uint32_t d = 0; d < devices_.size(); ++d) {
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    for (size_t i = 0; i < records.size(); ++i) {
      if (usable[i] && records[i].device == d) {
        ranges.emplace_back(records[i].offset, records[i].slot_bytes);
      }
    }
    std::sort(ranges.begin(), ranges.end());
    allocators_[d].ReserveSorted(ranges);  // disjoint and inside: every one is taken
  }
  chunks_.Reserve(records.size());
  std::vector<ChunkKey> dropped;
  for (size_t i = 0; i < records.size(); ++i) {
    const NvmeRecord& r = records[i];
    if (!usable[i]) {
      dropped.push_back(r.key);
      continue;
    }
    IndexLocked(r.key, r.parent, r.ns, {r.device, r.offset}, r.slot_bytes);
    counters_.used_bytes += r.slot_bytes;  // reserved above, not by AllocateLocked
  }
  for (size_t i = 0; i < records.size(); ++i) {
    if (usable[i] && records[i].parent != records[i].ns) {
      ++chunks_.Get(chunks_.Find(records[i].parent)).resident_children;
    }
  }
  counters_.dropped_at_start = dropped.size();
  if (!dropped.empty()) {
    spdlog::warn(
        "NVMe tier: dropped {} index records that were unusable (outside a device, "
        "misaligned, overlapping, or whose prefix is gone)",
        dropped.size());
    KVTIER_RETURN_IF_ERROR(index_->Delete(dropped));
  }
  return Status::Ok();
}

uint32_t NvmeTier::IndexLocked(const ChunkKey& key, const ChunkKey& parent, const NamespaceId& ns,
                               Location loc, uint64_t slot_bytes) {
  ChunkEntry e;
  e.key = key;
  e.parent = parent;
  e.slot_offset = loc.offset;
  e.ns_index = loc.device;  // in this tier: the device
  const uint32_t h = chunks_.Insert(e);
  if (h >= slot_bytes_.size()) {
    slot_bytes_.resize(h + 1);
    ns_.resize(h + 1);
  }
  slot_bytes_[h] = slot_bytes;
  ns_[h] = ns;
  policy_->OnInsert(h, slot_bytes, key.lo);
  ++counters_.chunks;
  return h;
}

void NvmeTier::UnpinLocked(uint32_t h) {
  if (--chunks_.Get(h).leases == 0) policy_->OnUnblocked(h);
}

void NvmeTier::EraseLocked(uint32_t h) {
  const ChunkEntry e = chunks_.Get(h);
  if (on_residency_) on_residency_(e.key, e.parent, ns_[h], {});
  policy_->OnRemove(h);
  if (e.parent != ns_[h]) {
    if (uint32_t ph = chunks_.Find(e.parent); ph != ChunkIndex::kNone) {
      auto& pc = chunks_.Get(ph).resident_children;
      if (pc > 0 && --pc == 0) policy_->OnUnblocked(ph);
    }
  }
  allocators_[e.ns_index].Free(e.slot_offset, slot_bytes_[h]);
  dirty_access_.erase(e.key);
  counters_.used_bytes -= slot_bytes_[h];
  --counters_.chunks;
  chunks_.Erase(h);
}

Result<SubtreeRemoval> NvmeTier::RemoveSubtrees(
    const std::function<bool(const ChunkKey& key, const NamespaceId& ns)>& pick) {
  std::lock_guard lock(mu_);
  SubtreeRemoval tally;
  std::vector<uint32_t> order =
      chunks_.SubtreesDeepestFirst([&](uint32_t h) { return pick(chunks_.Get(h).key, ns_[h]); });
  // Children come first, so a chunk is removable once none of its children stays.
  std::unordered_map<uint32_t, uint32_t> children_removed;
  std::vector<uint32_t> removable;
  std::vector<ChunkKey> keys;
  for (uint32_t h : order) {
    const ChunkEntry& e = chunks_.Get(h);
    if (e.leases != 0 || e.resident_children != children_removed[h]) {
      ++tally.kept;
      continue;
    }
    removable.push_back(h);
    keys.push_back(e.key);
    if (e.parent != ns_[h]) {
      if (uint32_t ph = chunks_.Find(e.parent); ph != ChunkIndex::kNone) ++children_removed[ph];
    }
  }
  if (keys.empty()) return tally;
  KVTIER_RETURN_IF_ERROR(index_->Delete(keys));  // records before slots, as eviction does
  for (uint32_t h : removable) EraseLocked(h);
  tally.removed = removable.size();
  return tally;
}

Result<bool> NvmeTier::EvictOneLocked(uint64_t same_size) {
  auto victim = policy_->PickVictim(same_size, /*take_held=*/false, [&](uint32_t h) {
    const ChunkEntry& e = chunks_.Get(h);
    return e.leases == 0 && e.resident_children == 0 ? EvictionPolicy::Verdict::kEvict
                                                     : EvictionPolicy::Verdict::kBlocked;
  });
  if (!victim) return false;
  // The record goes before the slot is reused; a crash in between leaves at
  // most a record whose header no longer matches, which a read rejects.
  std::vector<ChunkKey> key = {chunks_.Get(*victim).key};
  KVTIER_RETURN_IF_ERROR(index_->Delete(key));
  EraseLocked(*victim);
  ++counters_.evictions;
  return true;
}

Result<std::optional<NvmeTier::Location>> NvmeTier::AllocateLocked(uint64_t slot_bytes) {
  for (;;) {
    for (uint32_t d = 0; d < allocators_.size(); ++d) {
      if (auto off = allocators_[d].Allocate(slot_bytes)) {
        counters_.used_bytes += slot_bytes;
        return std::optional<Location>(Location{d, *off});
      }
    }
    Result<bool> evicted = EvictOneLocked(slot_bytes);
    if (evicted.ok() && !*evicted) evicted = EvictOneLocked(0);
    if (!evicted.ok()) return evicted.status();
    if (!*evicted) return std::optional<Location>();
  }
}

Result<size_t> NvmeTier::Write(std::span<const NvmeImage> images) {
  struct Planned {
    const NvmeImage* image;
    Location loc;
  };
  std::vector<Planned> planned;
  std::vector<uint32_t> pinned;
  if (std::string failed = index_->failure(); !failed.empty()) {
    return Status::IOError("the NVMe index takes no writes since one failed (" + failed + ")");
  }
  {
    std::lock_guard lock(mu_);
    std::vector<ChunkKey> in_batch;
    auto give_back = [&] {
      for (uint32_t h : pinned) UnpinLocked(h);
      for (const Planned& p : planned) {
        allocators_[p.loc.device].Free(p.loc.offset, p.image->image.size());
        counters_.used_bytes -= p.image->image.size();
      }
    };
    for (const NvmeImage& img : images) {
      if (img.image.empty() || img.image.size() % kBlockBytes != 0) {
        give_back();
        return Status::InvalidArgument("a slot image is not a positive multiple of 4096 bytes");
      }
      if (chunks_.Find(img.key) != ChunkIndex::kNone) continue;
      const bool parent_in_batch =
          std::find(in_batch.begin(), in_batch.end(), img.parent) != in_batch.end();
      if (img.parent != img.ns && !parent_in_batch) {
        const uint32_t ph = chunks_.Find(img.parent);
        if (ph == ChunkIndex::kNone) continue;  // would be an orphan
        ++chunks_.Get(ph).leases;               // keep it while making room
        pinned.push_back(ph);
      }
      auto loc = AllocateLocked(img.image.size());
      if (!loc.ok()) {  // the index refused an eviction: nothing of this batch is written
        give_back();
        return loc.status();
      }
      if (!*loc) break;
      planned.push_back({&img, **loc});
      in_batch.push_back(img.key);
    }
  }
  std::vector<IoRequest> reqs;
  std::vector<std::vector<IoRequest>> per_device(devices_.size());
  for (const Planned& p : planned) {
    per_device[p.loc.device].push_back(
        {IoRequest::Op::kWrite, p.loc.offset,
         std::span<std::byte>(const_cast<std::byte*>(p.image->image.data()),
                              p.image->image.size())});
  }
  Status st;
  for (size_t d = 0; st.ok() && d < devices_.size(); ++d) {
    if (per_device[d].empty()) continue;
    st = devices_[d]->Submit(per_device[d]);
    if (st.ok()) st = devices_[d]->Sync();
  }
  if (st.ok() && !planned.empty()) {
    const uint64_t written_ms = UnixMs();  // a chunk's first access: LRU order after a restart
    std::vector<NvmeRecord> records;
    for (const Planned& p : planned) {
      SlotHeader h;
      std::memcpy(&h, p.image->image.data(), sizeof(h));
      records.push_back({p.image->key, p.image->parent, p.image->ns, p.loc.device, p.loc.offset,
                         p.image->image.size(), h.sequence, h.payload_checksum, written_ms});
    }
    st = index_->Put(records);
  }
  std::lock_guard lock(mu_);
  if (st.ok()) {
    for (const Planned& p : planned) {
      SlotHeader h;
      std::memcpy(&h, p.image->image.data(), sizeof(h));
      max_sequence_ = std::max(max_sequence_, h.sequence);
    }
  }
  for (uint32_t h : pinned) UnpinLocked(h);
  if (!st.ok()) {
    for (const Planned& p : planned) {
      allocators_[p.loc.device].Free(p.loc.offset, p.image->image.size());
      counters_.used_bytes -= p.image->image.size();
    }
    return st;
  }
  for (const Planned& p : planned) {
    const NvmeImage& img = *p.image;
    IndexLocked(img.key, img.parent, img.ns, p.loc, img.image.size());
    if (on_residency_) on_residency_(img.key, img.parent, img.ns, img.image);
    if (img.parent != img.ns) {
      if (uint32_t ph = chunks_.Find(img.parent); ph != ChunkIndex::kNone) {
        ++chunks_.Get(ph).resident_children;
      }
    }
  }
  return planned.size();
}

Status NvmeTier::Read(const SlotIdentity& id, const SlotLayout& layout,
                      std::span<std::byte> buffer) {
  ReadRequest r{id, &layout, buffer, Status::Ok()};
  KVTIER_RETURN_IF_ERROR(ReadMany(std::span<ReadRequest>(&r, 1)));
  return r.result;
}

Status NvmeTier::ReadMany(std::span<ReadRequest> requests) {
  std::vector<uint32_t> handles(requests.size(), ChunkIndex::kNone);
  std::vector<std::vector<IoRequest>> per_device(devices_.size());
  std::vector<std::vector<size_t>> request_of(devices_.size());  // per device: index in `requests`
  {
    std::lock_guard lock(mu_);
    for (size_t i = 0; i < requests.size(); ++i) {
      ReadRequest& r = requests[i];
      const uint64_t slot_bytes = r.layout->slot_bytes;
      const uint32_t h = chunks_.Find(r.id.key);
      if (r.buffer.size() < slot_bytes) {
        r.result = Status::InvalidArgument("read buffer of " + std::to_string(r.buffer.size()) +
                                           " bytes is smaller than a slot of " +
                                           std::to_string(slot_bytes));
      } else if (h == ChunkIndex::kNone) {
        r.result = Status::NotFound("chunk " + r.id.key.ToHex() + " is not on NVMe");
      } else if (slot_bytes_[h] != slot_bytes) {
        r.result =
            Status::DataLoss("chunk " + r.id.key.ToHex() + " is stored with another slot size");
      } else {
        r.result = Status::Ok();
        ++chunks_.Get(h).leases;  // pinned while read
        handles[i] = h;
        const uint32_t d = chunks_.Get(h).ns_index;  // in this tier: the device
        per_device[d].push_back(
            {IoRequest::Op::kRead, chunks_.Get(h).slot_offset, r.buffer.first(slot_bytes)});
        request_of[d].push_back(i);
      }
    }
  }
  // Each image is verified as soon as it is read, while the next ones are
  // still in flight.
  Status io;
  for (size_t d = 0; io.ok() && d < devices_.size(); ++d) {
    if (per_device[d].empty()) continue;
    const std::vector<size_t>& of = request_of[d];
    io = devices_[d]->Submit(per_device[d], [&](size_t k) {
      ReadRequest& r = requests[of[k]];
      r.result = VerifySlotHeader(r.buffer.data(), *r.layout, r.id, /*check_header_checksum=*/true);
      if (r.result.ok()) r.result = VerifySlotPayload(r.buffer.data(), *r.layout);
    });
  }
  std::lock_guard lock(mu_);
  const uint64_t now_ms = UnixMs();
  std::vector<ChunkKey> bad;
  for (size_t i = 0; i < requests.size(); ++i) {
    const uint32_t h = handles[i];
    if (h == ChunkIndex::kNone) continue;
    // Nothing erases a pinned chunk (a corrupt one is dropped by its last reader below),
    // so `h` is still this key's entry.
    UnpinLocked(h);
    if (!io.ok()) {
      requests[i].result = io;
    } else if (!requests[i].result.ok()) {
      ++counters_.corrupt_reads;
      if (auto held_back = corrupt_log_.Admit()) {
        spdlog::warn("NVMe tier: chunk {} failed verification and is dropped: {}{}",
                     requests[i].id.key.ToHex(), requests[i].result.message(),
                     HeldBack(*held_back));
      }
      // Another read of it (this batch's or a concurrent one) still holds it: that read
      // finds the same bytes on disk and drops it when it ends.
      if (chunks_.Get(h).leases != 0) continue;
      bad.push_back(requests[i].id.key);
      EraseLocked(h);
    } else {
      policy_->OnAccess(h);
      dirty_access_[requests[i].id.key] = now_ms;
    }
  }
  if (!bad.empty()) {
    // The in-memory index has dropped them already; a failed delete leaves
    // records that the next start's reads reject again. The index then takes
    // no more writes, which makes the tier degraded (write_failure).
    if (Status st = index_->Delete(bad); !st.ok()) {
      spdlog::error("NVMe tier: dropping the records of {} corrupt chunks failed: {}", bad.size(),
                    st.ToString());
    }
  }
  return io;
}

Status NvmeTier::RegisterBuffers(std::span<const std::span<std::byte>> regions) {
  Status first;
  for (auto& d : devices_) {
    Status st = d->RegisterBuffers(regions);
    if (first.ok() && !st.ok()) first = st;
  }
  return first;
}

bool NvmeTier::Contains(const ChunkKey& key) const {
  std::lock_guard lock(mu_);
  return chunks_.Find(key) != ChunkIndex::kNone;
}

std::optional<NvmeChunkInfo> NvmeTier::Info(const ChunkKey& key) const {
  std::lock_guard lock(mu_);
  const uint32_t h = chunks_.Find(key);
  if (h == ChunkIndex::kNone) return std::nullopt;
  return NvmeChunkInfo{key, ns_[h], slot_bytes_[h], chunks_.Get(h).leases != 0};
}

void NvmeTier::VisitChunks(const std::function<bool(const NvmeChunkInfo&)>& f) const {
  std::lock_guard lock(mu_);
  bool more = true;
  chunks_.ForEach([&](uint32_t h) {
    if (more) more = f({chunks_.Get(h).key, ns_[h], slot_bytes_[h], chunks_.Get(h).leases != 0});
  });
}

uint64_t NvmeTier::max_sequence() const {
  std::lock_guard lock(mu_);
  return max_sequence_;
}

NvmeTierCounters NvmeTier::counters() const {
  std::lock_guard lock(mu_);
  return counters_;
}

}  // namespace kvtier
