#include "kvtier/layerwise.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstddef>
#include <set>
#include <utility>

namespace kvtier {

Status FromGpu(const gpu::GpuStatus& st, const std::string& what) {
  if (st.ok()) return Status::Ok();
  const std::string message = what + ": " + st.ToString();
  switch (st.code()) {
    case gpu::GpuCode::kInvalidArgument:
      return Status::InvalidArgument(message);
    case gpu::GpuCode::kOutOfMemory:
      return Status::ResourceExhausted(message);
    default:
      return Status::Unavailable(message);
  }
}

Result<std::vector<uint32_t>> KvCacheGroups(const PagedKvCache& cache) {
  if (cache.group_layers.empty()) {
    return std::vector<uint32_t>{static_cast<uint32_t>(cache.layers.size())};
  }
  uint64_t grouped = 0;
  for (size_t g = 0; g < cache.group_layers.size(); ++g) {
    if (cache.group_layers[g] == 0) {
      return Status::InvalidArgument("cache.group_layers[" + std::to_string(g) +
                                     "] is 0: every group needs a layer");
    }
    grouped += cache.group_layers[g];
  }
  if (grouped != cache.layers.size()) {
    return Status::InvalidArgument("cache.group_layers add up to " + std::to_string(grouped) +
                                   " layers; cache.layers holds " +
                                   std::to_string(cache.layers.size()));
  }
  return cache.group_layers;
}

namespace {

// `options`, borrowing device buffers from `arena` unless they name a cache.
gpu::KvTransferOptions WithScratch(gpu::KvTransferOptions options, GpuArena& arena) {
  if (options.scratch == nullptr) options.scratch = &arena.scratch();
  return options;
}

// Builds the cache's layout and its layers per group, and checks them against the
// namespace's chunk payload.
Status CheckCache(const PagedKvCache& cache, const NamespaceHandle& ns, gpu::KvLayout* layout,
                  std::vector<uint32_t>* groups) {
  KVTIER_RETURN_IF_ERROR(FromGpu(gpu::KvLayout::Create(cache.layout, layout), "cache.layout"));
  auto grouped = KvCacheGroups(cache);
  if (!grouped.ok()) return grouped.status();
  *groups = std::move(grouped).value();
  const uint32_t ct = ns.spec.chunk_tokens;
  if (cache.layers.size() != ns.spec.num_layers) {
    return Status::InvalidArgument("cache.layers holds " + std::to_string(cache.layers.size()) +
                                   " layers; the namespace has " +
                                   std::to_string(ns.spec.num_layers));
  }
  if (ct % layout->block_size_tokens() != 0) {
    return Status::InvalidArgument("cache.layout.block_size_tokens " +
                                   std::to_string(layout->block_size_tokens()) +
                                   " does not divide chunk_tokens " + std::to_string(ct));
  }
  const uint64_t bytes = layout->LayerPayloadBytes(ct) * ns.spec.num_layers;
  if (bytes != ns.layout.payload_bytes) {
    return Status::InvalidArgument("cache.layout gives " + std::to_string(bytes) +
                                   " bytes per chunk; the namespace's payload is " +
                                   std::to_string(ns.layout.payload_bytes) +
                                   " (heads, head_dim or element size differ)");
  }
  return Status::Ok();
}

// A chunk set of the `layers` layers of `ns` in `layout` over `arena`, without chunks yet.
gpu::KvChunkSet ChunkSetOf(const gpu::KvLayout& layout, const NamespaceHandle& ns,
                           const gpu::PinnedRange* arena, uint32_t layers) {
  gpu::KvChunkSet chunks;
  chunks.layout = &layout;
  chunks.num_layers = layers;
  chunks.chunk_tokens = ns.spec.chunk_tokens;
  chunks.arena = arena;
  return chunks;
}

// One chunk set per group: group g's payloads start after the earlier groups' layers,
// and its layer tensors are the next groups[g] of `layers`.
struct GroupSets {
  std::vector<gpu::KvChunkSet> chunks;
  std::vector<std::vector<gpu::LayerTensors>> layers;
};
GroupSets SplitByGroup(const gpu::KvLayout& layout, const NamespaceHandle& ns,
                       const gpu::PinnedRange* arena, const std::vector<uint32_t>& groups,
                       const std::vector<gpu::LayerTensors>& layers) {
  GroupSets out;
  size_t first = 0;
  for (uint32_t n : groups) {
    out.chunks.push_back(ChunkSetOf(layout, ns, arena, n));
    out.layers.emplace_back(layers.begin() + static_cast<ptrdiff_t>(first),
                            layers.begin() + static_cast<ptrdiff_t>(first + n));
    first += n;
  }
  return out;
}

// Adds a chunk at `payload` to every group's set: group g's part of it.
void AddPayload(GroupSets& sets, std::byte* payload, const gpu::KvLayout& layout,
                uint32_t chunk_tokens) {
  uint64_t offset = 0;
  for (gpu::KvChunkSet& c : sets.chunks) {
    c.payloads.push_back(payload + offset);
    offset += layout.LayerPayloadBytes(chunk_tokens) * static_cast<uint64_t>(c.num_layers);
  }
}

// The group of model layer `layer` and its index within the group.
std::pair<size_t, int64_t> GroupOf(const std::vector<uint32_t>& groups, int64_t layer) {
  size_t g = 0;
  for (; g + 1 < groups.size() && layer >= static_cast<int64_t>(groups[g]); ++g) {
    layer -= groups[g];
  }
  return {g, layer};
}

Status CheckTables(BlockTables tables, const std::vector<uint32_t>& groups) {
  if (tables.size() != groups.size()) {
    return Status::InvalidArgument(std::to_string(tables.size()) + " block tables for " +
                                   std::to_string(groups.size()) + " KV cache groups");
  }
  return Status::Ok();
}

Status CheckLayer(int64_t layer, const NamespaceHandle& ns) {
  if (layer < 0 || layer >= static_cast<int64_t>(ns.spec.num_layers)) {
    return Status::InvalidArgument("layer " + std::to_string(layer) + " is outside 0.." +
                                   std::to_string(ns.spec.num_layers - 1));
  }
  return Status::Ok();
}

// The block ids of chunks `first` .. `first + count` of a prompt's block table.
std::vector<int32_t> ChunkBlocks(std::span<const int32_t> table, size_t first, size_t count,
                                 size_t blocks_per_chunk) {
  const auto begin = table.begin() + static_cast<ptrdiff_t>(first * blocks_per_chunk);
  return {begin, begin + static_cast<ptrdiff_t>(count * blocks_per_chunk)};
}

}  // namespace

Result<std::shared_ptr<const gpu::PinnedRange>> GpuArena::For(
    const std::shared_ptr<Arena>& mapping) {
  std::lock_guard lock(mu_);
  for (const auto& e : entries_) {
    if (e->mapping == mapping) return std::shared_ptr<const gpu::PinnedRange>(e, &e->range);
  }
  auto entry = std::make_shared<Entry>();
  entry->mapping = mapping;
  KVTIER_RETURN_IF_ERROR(FromGpu(
      runtime_.RegisterHost(mapping->base(), mapping->bytes(), gpu::PinOptions(), &entry->range),
      "registering the kvtier arena with the GPU runtime"));
  entries_.push_back(entry);
  DropStale();
  return std::shared_ptr<const gpu::PinnedRange>(entry, &entry->range);
}

Result<std::shared_ptr<const gpu::DeviceBuffer>> GpuArena::Pool(const HbmPoolInfo& pool) {
  std::lock_guard lock(mu_);
  for (const auto& p : pools_) {
    if (p->ipc_handle != pool.ipc_handle) continue;
    if (!p->error.ok()) return p->error;
    return std::shared_ptr<const gpu::DeviceBuffer>(p, &p->buffer);
  }
  auto opened = std::make_shared<OpenedPool>();
  opened->ipc_handle = pool.ipc_handle;
  opened->epoch = pool.epoch;
  const bool host = runtime_.backend() == gpu::Backend::kHost;
  if ((pool.backend == "host") != host) {
    opened->error =
        Status::FailedPrecondition("the daemon's HBM pool is on the '" + pool.backend +
                                   "' backend; this runtime is " + std::string(runtime_.name()));
  } else {
    opened->error =
        FromGpu(runtime_.OpenExported(pool.ipc_handle, pool.pool_bytes, &opened->buffer),
                "opening kvtierd's HBM pool");
  }
  pools_.push_back(opened);
  DropStale();
  if (!opened->error.ok()) {
    spdlog::warn("kvtier client: {}; loads copy from DRAM", opened->error.ToString());
    return opened->error;
  }
  return std::shared_ptr<const gpu::DeviceBuffer>(opened, &opened->buffer);
}

void GpuArena::DropStale() {
  // use_count() == 1: only this arena holds it (no load, store or client).
  std::erase_if(entries_, [](const std::shared_ptr<Entry>& e) {
    return e.use_count() == 1 && e->mapping.use_count() == 1;
  });
  std::erase_if(pools_, [&](const std::shared_ptr<OpenedPool>& p) {
    return p.use_count() == 1 && std::none_of(entries_.begin(), entries_.end(), [&](const auto& e) {
             return e->mapping->epoch() == p->epoch;
           });
  });
}

size_t GpuArena::held_arenas() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

size_t GpuArena::held_pools() const {
  std::lock_guard lock(mu_);
  return pools_.size();
}

// ---- LayerwiseLoader --------------------------------------------------------

LayerwiseLoader::LayerwiseLoader(Client& client, NamespaceHandle ns, GpuArena& arena,
                                 PagedKvCache cache, gpu::Runtime& runtime,
                                 gpu::KvTransferOptions options)
    : client_(client),
      ns_(std::move(ns)),
      arena_(arena),
      cache_(std::move(cache)),
      runtime_(runtime),
      options_(WithScratch(options, arena)) {}

LayerwiseLoader::~LayerwiseLoader() {
  loads_.clear();  // synchronizes the load stream: no copy reads a released slot
  lease_.Release();
}

Result<uint64_t> LayerwiseLoader::StartLoad(std::span<const int32_t> tokens,
                                            std::span<const int32_t> block_ids,
                                            gpu::Stream& load_stream, const PrefetchTicket* ticket,
                                            size_t first_chunk, std::string_view request_id) {
  const std::vector<int32_t> table(block_ids.begin(), block_ids.end());
  return StartLoad(tokens, BlockTables(&table, 1), load_stream, ticket, first_chunk, request_id);
}

Result<uint64_t> LayerwiseLoader::StartLoad(std::span<const int32_t> tokens,
                                            BlockTables block_tables, gpu::Stream& load_stream,
                                            const PrefetchTicket* ticket, size_t first_chunk,
                                            std::string_view request_id) {
  if (started_) return Status::InvalidArgument("StartLoad was already called on this loader");
  KVTIER_RETURN_IF_ERROR(CheckCache(cache_, ns_, &layout_, &groups_));
  KVTIER_RETURN_IF_ERROR(CheckTables(block_tables, groups_));
  started_ = true;
  const uint32_t ct = ns_.spec.chunk_tokens;
  const size_t per_chunk = ct / static_cast<size_t>(layout_.block_size_tokens());
  // Only chunks whose blocks every table covers can be delivered.
  size_t covered = block_tables[0].size() / per_chunk;
  for (const auto& table : block_tables) covered = std::min(covered, table.size() / per_chunk);
  auto acquired =
      client_.Acquire(ns_, tokens, covered, ticket, HbmUsable(), request_id, first_chunk);
  if (!acquired.ok()) return acquired.status();
  lease_ = std::move(acquired).value();
  const uint32_t n = lease_.num_chunks();
  if (n == 0) return uint64_t{0};  // a miss, or the cache failed open
  first_chunk_ = static_cast<uint32_t>(std::min<size_t>(first_chunk, n));
  if (first_chunk_ == n) {  // the engine holds all of it already
    lease_.Release();
    return uint64_t{n} * ct;
  }
  auto range = arena_.For(lease_.mapping());
  if (!range.ok()) {
    lease_.Release();
    return range.status();
  }
  range_ = std::move(range).value();
  GroupSets sets = SplitByGroup(layout_, ns_, range_.get(), groups_, cache_.layers);
  if (lease_.hbm_chunks > 0) {
    auto pool = arena_.Pool(*lease_.hbm_pool());
    if (pool.ok()) pool_ = std::move(pool).value();  // else every chunk comes from DRAM
  }
  for (uint32_t i = first_chunk_; i < n; ++i) {
    const uint64_t hbm_offset = pool_ != nullptr ? lease_.hbm_payload_offset(i) : 0;
    hbm_chunks_ += hbm_offset != 0;
    AddPayload(sets,
               hbm_offset != 0 ? static_cast<std::byte*>(pool_->data()) + hbm_offset
                               : const_cast<std::byte*>(lease_.payload(i).data()),
               layout_, ct);
  }
  load_stream_ = &load_stream;
  gpu::GpuStatus st;
  for (size_t g = 0; g < groups_.size() && st.ok(); ++g) {
    block_ids_.push_back(ChunkBlocks(block_tables[g], first_chunk_, n - first_chunk_, per_chunk));
    sets.chunks[g].block_ids = block_ids_[g];
    sets.chunks[g].device_pool = pool_.get();
    st = gpu::LayerwiseLoad::Create(runtime_, std::move(sets.chunks[g]), std::move(sets.layers[g]),
                                    options_, load_stream, &loads_.emplace_back());
  }
  if (!st.ok()) {  // nothing queued but uploads: wait for them, then let go
    loads_.clear();
    lease_.Release();
    return FromGpu(st, "queueing the layerwise load");
  }
  // Once queued, a failure is per chunk and reported by Finish.
  for (auto& load : loads_) (void)load->Start();
  return uint64_t{n} * ct;
}

Status LayerwiseLoader::WaitLayer(int64_t layer, gpu::Stream& compute_stream) {
  KVTIER_RETURN_IF_ERROR(CheckLayer(layer, ns_));
  if (loads_.empty()) return Status::Ok();  // nothing to load
  const auto [g, local] = GroupOf(groups_, layer);
  // A layer the load could not queue has no event: its chunks are reported
  // failed by Finish, so the engine need not wait for them.
  const gpu::GpuStatus st = loads_[g]->WaitLayer(local, compute_stream);
  return st.code() == gpu::GpuCode::kInvalidArgument ? Status::Ok() : FromGpu(st, "WaitLayer");
}

const gpu::Event* LayerwiseLoader::layer_event(int64_t layer) const {
  if (loads_.empty()) return nullptr;
  const auto [g, local] = GroupOf(groups_, layer);
  return &loads_[g]->layer_event(local);
}

Result<std::vector<int32_t>> LayerwiseLoader::Finish() {
  if (!started_) return Status::InvalidArgument("Finish without StartLoad");
  std::vector<int32_t> recompute;
  // A lease that lapsed mid-copy (past its TTL) may have let a slot be
  // rewritten: the copied chunks from the first changed one on are recomputed
  // too (all of them when it was one the engine had already). Read once every
  // copy is done.
  std::vector<gpu::KvCopyReport> reports(loads_.size());
  for (size_t g = 0; g < loads_.size(); ++g) {
    (void)loads_[g]->Finish(&reports[g]);  // every failure is in the report, per chunk
  }
  const uint32_t valid = loads_.empty() ? 0 : std::min(lease_.ValidChunks(), ValidHbmChunks());
  for (size_t g = 0; g < loads_.size(); ++g) {
    std::vector<int32_t> group = reports[g].FailedBlockIds();
    const size_t copied = lease_.num_chunks() - first_chunk_;
    const size_t per_chunk = block_ids_[g].size() / copied;
    const size_t bad_from = std::max(valid, first_chunk_) - first_chunk_;
    for (auto it = block_ids_[g].begin() + static_cast<ptrdiff_t>(bad_from * per_chunk);
         it != block_ids_[g].end(); ++it) {
      if (*it != gpu::kSkipBlock) group.push_back(*it);  // the engine's own blocks are fine
    }
    std::sort(group.begin(), group.end());
    group.erase(std::unique(group.begin(), group.end()), group.end());
    recompute.insert(recompute.end(), group.begin(), group.end());
  }
  loads_.clear();
  lease_.Release();  // only now: every copy has completed
  return recompute;
}

bool LayerwiseLoader::HbmUsable() {
  const std::optional<HbmPoolInfo> pool = client_.HbmPool();
  return pool && arena_.Pool(*pool).ok();
}

uint32_t LayerwiseLoader::ValidHbmChunks() {
  const uint32_t n = lease_.num_chunks();
  if (hbm_chunks_ == 0) return n;
  // The sequence of each HBM slot copied from, read back on the load stream
  // after the copies.
  std::vector<uint64_t> seen(n, 0);
  const uint64_t to_sequence = ns_.layout.header_bytes - offsetof(SlotHeader, sequence);
  gpu::GpuStatus st;
  for (uint32_t i = first_chunk_; i < n && st.ok(); ++i) {
    if (const uint64_t off = lease_.hbm_payload_offset(i); off != 0) {
      st = runtime_.CopyAsync(&seen[i],
                              static_cast<const std::byte*>(pool_->data()) + off - to_sequence,
                              sizeof(uint64_t), *load_stream_);
    }
  }
  if (st.ok()) st = runtime_.Synchronize(*load_stream_);
  if (!st.ok()) return 0;  // cannot tell: recompute them all
  uint32_t valid = first_chunk_;
  for (; valid < n; ++valid) {
    if (lease_.hbm_payload_offset(valid) != 0 && seen[valid] != lease_.hbm_sequence(valid)) break;
  }
  return valid;
}

// ---- LayerwiseStorer --------------------------------------------------------

LayerwiseStorer::LayerwiseStorer(Client& client, NamespaceHandle ns, GpuArena& arena,
                                 PagedKvCache cache, gpu::Runtime& runtime,
                                 gpu::KvTransferOptions options)
    : client_(client),
      ns_(std::move(ns)),
      arena_(arena),
      cache_(std::move(cache)),
      runtime_(runtime),
      options_(WithScratch(options, arena)) {}

LayerwiseStorer::~LayerwiseStorer() {
  stores_.clear();  // synchronizes the store stream before the slots are given back
  reservation_.Abort();
}

Result<uint32_t> LayerwiseStorer::Start(std::span<const int32_t> tokens,
                                        std::span<const int32_t> block_ids,
                                        gpu::Stream& store_stream, size_t first_chunk) {
  const std::vector<int32_t> table(block_ids.begin(), block_ids.end());
  return Start(tokens, BlockTables(&table, 1), store_stream, first_chunk);
}

Result<uint32_t> LayerwiseStorer::Start(std::span<const int32_t> tokens, BlockTables block_tables,
                                        gpu::Stream& store_stream, size_t first_chunk) {
  if (started_) return Status::InvalidArgument("Start was already called on this storer");
  KVTIER_RETURN_IF_ERROR(CheckCache(cache_, ns_, &layout_, &groups_));
  KVTIER_RETURN_IF_ERROR(CheckTables(block_tables, groups_));
  const uint32_t ct = ns_.spec.chunk_tokens;
  const size_t per_chunk = ct / static_cast<size_t>(layout_.block_size_tokens());
  const size_t full_chunks = tokens.size() / ct;
  for (size_t g = 0; g < block_tables.size(); ++g) {
    if (block_tables[g].size() < full_chunks * per_chunk) {
      return Status::InvalidArgument((block_tables.size() > 1 ? "block table " + std::to_string(g)
                                                              : std::string("block_ids")) +
                                     " holds " + std::to_string(block_tables[g].size()) +
                                     " blocks; the prompt's " + std::to_string(full_chunks) +
                                     " full chunks need " +
                                     std::to_string(full_chunks * per_chunk));
    }
  }
  started_ = true;
  auto reserved = client_.Reserve(ns_, tokens, first_chunk);
  if (!reserved.ok()) return reserved.status();
  reservation_ = std::move(reserved).value();
  const size_t n = reservation_.size();
  if (n == 0) return uint32_t{0};
  auto range = arena_.For(reservation_.mapping());
  if (!range.ok()) {
    reservation_.Abort();
    return range.status();
  }
  range_ = std::move(range).value();
  GroupSets sets = SplitByGroup(layout_, ns_, range_.get(), groups_, cache_.layers);
  for (size_t k = 0; k < n; ++k) {
    AddPayload(sets, reservation_.payload(k).data(), layout_, ct);
    for (size_t g = 0; g < groups_.size(); ++g) {
      const std::vector<int32_t> blocks =
          ChunkBlocks(block_tables[g], reservation_.chunk_index(k), 1, per_chunk);
      sets.chunks[g].block_ids.insert(sets.chunks[g].block_ids.end(), blocks.begin(), blocks.end());
    }
  }
  gpu::GpuStatus st;
  for (size_t g = 0; g < groups_.size() && st.ok(); ++g) {
    st = gpu::LayerwiseStore::Create(runtime_, std::move(sets.chunks[g]), std::move(sets.layers[g]),
                                     options_, store_stream, &stores_.emplace_back());
  }
  if (!st.ok()) {
    stores_.clear();
    reservation_.Abort();
    return FromGpu(st, "preparing the layerwise store");
  }
  return static_cast<uint32_t>(n);
}

Status LayerwiseStorer::LayerDone(int64_t layer, gpu::Stream& compute_stream) {
  KVTIER_RETURN_IF_ERROR(CheckLayer(layer, ns_));
  if (stores_.empty()) return Status::Ok();  // nothing to store
  const auto [g, local] = GroupOf(groups_, layer);
  return FromGpu(stores_[g]->LayerWritten(local, compute_stream), "LayerDone");
}

Result<StoreResult> LayerwiseStorer::Finish() {
  if (!started_) return Status::InvalidArgument("Finish without Start");
  if (stores_.empty()) return reservation_.Commit();  // nothing was reserved: the counts only
  gpu::GpuStatus st;
  std::set<int64_t> failed;  // chunk indexes, of any group
  for (auto& store : stores_) {
    gpu::KvCopyReport report;
    const gpu::GpuStatus group_st = store->Finish(&report);  // waits even after a failure
    if (st.ok()) st = group_st;
    for (const auto& f : report.failed_chunks) failed.insert(f.chunk_index);
  }
  stores_.clear();
  if (!st.ok() || !failed.empty()) {
    StoreResult result;
    result.already_stored_chunks = reservation_.already_stored_chunks;
    result.being_written_chunks = reservation_.being_written_chunks;
    result.dropped_chunks =
        reservation_.dropped_chunks + static_cast<uint32_t>(reservation_.size());
    result.fail_open = st.ok() ? Status::Aborted(std::to_string(failed.size()) +
                                                 " chunks failed to copy; nothing was committed")
                               : FromGpu(st, "layerwise store");
    reservation_.Abort();
    return result;
  }
  return reservation_.Commit();
}

}  // namespace kvtier
