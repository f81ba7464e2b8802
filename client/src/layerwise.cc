#include "kvtier/layerwise.h"

#include <algorithm>
#include <cstddef>

#include <spdlog/spdlog.h>

namespace kvtier {

Status FromGpu(const gpu::GpuStatus& st, const std::string& what) {
  if (st.ok()) return Status::Ok();
  const std::string message = what + ": " + st.ToString();
  switch (st.code()) {
    case gpu::GpuCode::kInvalidArgument: return Status::InvalidArgument(message);
    case gpu::GpuCode::kOutOfMemory: return Status::ResourceExhausted(message);
    default: return Status::Unavailable(message);
  }
}

namespace {

// `options`, borrowing device buffers from `arena` unless they name a cache.
gpu::KvTransferOptions WithScratch(gpu::KvTransferOptions options, GpuArena& arena) {
  if (options.scratch == nullptr) options.scratch = &arena.scratch();
  return options;
}

// Builds the cache's layout and checks it against the namespace's chunk payload.
Status CheckCache(const PagedKvCache& cache, const NamespaceHandle& ns, gpu::KvLayout* layout) {
  KVTIER_RETURN_IF_ERROR(FromGpu(gpu::KvLayout::Create(cache.layout, layout), "cache.layout"));
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

// A chunk set of `ns` in `layout` over `arena`, without chunks yet.
gpu::KvChunkSet ChunkSetOf(const gpu::KvLayout& layout, const NamespaceHandle& ns,
                           const gpu::PinnedRange* arena) {
  gpu::KvChunkSet chunks;
  chunks.layout = &layout;
  chunks.num_layers = ns.spec.num_layers;
  chunks.chunk_tokens = ns.spec.chunk_tokens;
  chunks.arena = arena;
  return chunks;
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
  KVTIER_RETURN_IF_ERROR(FromGpu(runtime_.RegisterHost(mapping->base(), mapping->bytes(),
                                                       gpu::PinOptions(), &entry->range),
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
    opened->error = Status::FailedPrecondition("the daemon's HBM pool is on the '" +
                                               pool.backend + "' backend; this runtime is " +
                                               std::string(runtime_.name()));
  } else {
    opened->error = FromGpu(runtime_.OpenExported(pool.ipc_handle, pool.pool_bytes,
                                                  &opened->buffer),
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
    return p.use_count() == 1 &&
           std::none_of(entries_.begin(), entries_.end(),
                        [&](const auto& e) { return e->mapping->epoch() == p->epoch; });
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
  load_.reset();  // synchronizes the load stream: no copy reads a released slot
  lease_.Release();
}

Result<uint64_t> LayerwiseLoader::StartLoad(std::span<const int32_t> tokens,
                                            std::span<const int32_t> block_ids,
                                            gpu::Stream& load_stream,
                                            const PrefetchTicket* ticket, size_t first_chunk,
                                            std::string_view request_id) {
  if (started_) return Status::InvalidArgument("StartLoad was already called on this loader");
  KVTIER_RETURN_IF_ERROR(CheckCache(cache_, ns_, &layout_));
  started_ = true;
  const uint32_t ct = ns_.spec.chunk_tokens;
  const size_t per_chunk = ct / static_cast<size_t>(layout_.block_size_tokens());
  // Only chunks whose blocks the table covers can be delivered.
  auto acquired =
      client_.Acquire(ns_, tokens, block_ids.size() / per_chunk, ticket, HbmUsable(), request_id,
                      first_chunk);
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
  gpu::KvChunkSet chunks = ChunkSetOf(layout_, ns_, range_.get());
  if (lease_.hbm_chunks > 0) {
    auto pool = arena_.Pool(*lease_.hbm_pool());
    if (pool.ok()) pool_ = std::move(pool).value();  // else every chunk comes from DRAM
  }
  chunks.device_pool = pool_.get();
  for (uint32_t i = first_chunk_; i < n; ++i) {
    const uint64_t hbm_offset = pool_ != nullptr ? lease_.hbm_payload_offset(i) : 0;
    hbm_chunks_ += hbm_offset != 0;
    chunks.payloads.push_back(hbm_offset != 0
                                  ? static_cast<std::byte*>(pool_->data()) + hbm_offset
                                  : const_cast<std::byte*>(lease_.payload(i).data()));
  }
  load_stream_ = &load_stream;
  block_ids_ = ChunkBlocks(block_ids, first_chunk_, n - first_chunk_, per_chunk);
  chunks.block_ids = block_ids_;
  gpu::GpuStatus st = gpu::LayerwiseLoad::Create(runtime_, std::move(chunks), cache_.layers,
                                                 options_, load_stream, &load_);
  if (st.ok()) st = load_->Start();
  if (!st.ok() && load_ == nullptr) {  // nothing queued: nothing to wait for
    lease_.Release();
    return FromGpu(st, "queueing the layerwise load");
  }
  // Once queued, a failure is per chunk and reported by Finish.
  return uint64_t{n} * ct;
}

Status LayerwiseLoader::WaitLayer(int64_t layer, gpu::Stream& compute_stream) {
  KVTIER_RETURN_IF_ERROR(CheckLayer(layer, ns_));
  if (!load_) return Status::Ok();  // nothing to load
  // A layer the load could not queue has no event: its chunks are reported
  // failed by Finish, so the engine need not wait for them.
  const gpu::GpuStatus st = load_->WaitLayer(layer, compute_stream);
  return st.code() == gpu::GpuCode::kInvalidArgument ? Status::Ok()
                                                     : FromGpu(st, "WaitLayer");
}

const gpu::Event* LayerwiseLoader::layer_event(int64_t layer) const {
  return load_ ? &load_->layer_event(layer) : nullptr;
}

Result<std::vector<int32_t>> LayerwiseLoader::Finish() {
  if (!started_) return Status::InvalidArgument("Finish without StartLoad");
  std::vector<int32_t> recompute;
  if (load_) {
    gpu::KvCopyReport report;
    (void)load_->Finish(&report);  // every failure is in the report, per chunk
    recompute = report.FailedBlockIds();
    // A lease that lapsed mid-copy (past its TTL) may have let a slot be
    // rewritten: the copied chunks from the first changed one on are
    // recomputed too (all of them when it was one the engine had already).
    const uint32_t valid = std::min(lease_.ValidChunks(), ValidHbmChunks());
    const size_t copied = lease_.num_chunks() - first_chunk_;
    const size_t per_chunk = block_ids_.size() / copied;
    const size_t bad_from = std::max(valid, first_chunk_) - first_chunk_;
    for (auto it = block_ids_.begin() + static_cast<ptrdiff_t>(bad_from * per_chunk);
         it != block_ids_.end(); ++it) {
      if (*it != gpu::kSkipBlock) recompute.push_back(*it);  // the engine's own blocks are fine
    }
    std::sort(recompute.begin(), recompute.end());
    recompute.erase(std::unique(recompute.begin(), recompute.end()), recompute.end());
    load_.reset();
  }
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
      st = runtime_.CopyAsync(&seen[i], static_cast<const std::byte*>(pool_->data()) + off -
                                            to_sequence,
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
  store_.reset();  // synchronizes the store stream before the slots are given back
  reservation_.Abort();
}

Result<uint32_t> LayerwiseStorer::Start(std::span<const int32_t> tokens,
                                        std::span<const int32_t> block_ids,
                                        gpu::Stream& store_stream, size_t first_chunk) {
  if (started_) return Status::InvalidArgument("Start was already called on this storer");
  KVTIER_RETURN_IF_ERROR(CheckCache(cache_, ns_, &layout_));
  const uint32_t ct = ns_.spec.chunk_tokens;
  const size_t per_chunk = ct / static_cast<size_t>(layout_.block_size_tokens());
  const size_t full_chunks = tokens.size() / ct;
  if (block_ids.size() < full_chunks * per_chunk) {
    return Status::InvalidArgument("block_ids holds " + std::to_string(block_ids.size()) +
                                   " blocks; the prompt's " + std::to_string(full_chunks) +
                                   " full chunks need " + std::to_string(full_chunks * per_chunk));
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
  gpu::KvChunkSet chunks = ChunkSetOf(layout_, ns_, range_.get());
  for (size_t k = 0; k < n; ++k) {
    chunks.payloads.push_back(reservation_.payload(k).data());
    const std::vector<int32_t> blocks =
        ChunkBlocks(block_ids, reservation_.chunk_index(k), 1, per_chunk);
    chunks.block_ids.insert(chunks.block_ids.end(), blocks.begin(), blocks.end());
  }
  const gpu::GpuStatus st = gpu::LayerwiseStore::Create(runtime_, std::move(chunks), cache_.layers,
                                                        options_, store_stream, &store_);
  if (!st.ok()) {
    reservation_.Abort();
    return FromGpu(st, "preparing the layerwise store");
  }
  return static_cast<uint32_t>(n);
}

Status LayerwiseStorer::LayerDone(int64_t layer, gpu::Stream& compute_stream) {
  KVTIER_RETURN_IF_ERROR(CheckLayer(layer, ns_));
  if (!store_) return Status::Ok();  // nothing to store
  return FromGpu(store_->LayerWritten(layer, compute_stream), "LayerDone");
}

Result<StoreResult> LayerwiseStorer::Finish() {
  if (!started_) return Status::InvalidArgument("Finish without Start");
  if (!store_) return reservation_.Commit();  // nothing was reserved: the counts only
  gpu::KvCopyReport report;
  const gpu::GpuStatus st = store_->Finish(&report);
  store_.reset();
  if (!st.ok() || !report.failed_chunks.empty()) {
    StoreResult result;
    result.already_stored_chunks = reservation_.already_stored_chunks;
    result.being_written_chunks = reservation_.being_written_chunks;
    result.dropped_chunks = reservation_.dropped_chunks + static_cast<uint32_t>(reservation_.size());
    result.fail_open = st.ok() ? Status::Aborted(std::to_string(report.failed_chunks.size()) +
                                                 " chunks failed to copy; nothing was committed")
                               : FromGpu(st, "layerwise store");
    reservation_.Abort();
    return result;
  }
  return reservation_.Commit();
}

}  // namespace kvtier
