// Layerwise load and store between kvtierd's shared DRAM arena (or its HBM
// pool, when the daemon runs with --hbm-bytes) and an engine's paged KV cache
// on the GPU (DESIGN.md "Layerwise load"). Where each call goes
// in a vLLM KV connector is in the README ("Engine integration").
//
//   GpuArena arena(runtime);                          // once per process
//   LayerwiseLoader loader(client, ns, arena, cache, runtime);
//   loader.StartLoad(tokens, block_ids, load_stream); // leases, queues the first layers
//   for i: loader.WaitLayer(i, compute_stream); attention(i);  // queues a layer more
//   loader.Finish();                                  // the rest; block ids to recompute
//
//   LayerwiseStorer storer(client, ns, arena, cache, runtime);
//   storer.Start(tokens, block_ids, store_stream, first_new_chunk);
//   for i: attention(i) writes KV; storer.LayerDone(i, compute_stream);
//   storer.Finish();                                  // commit, or abort on any error
//
// Every wait is a stream wait on an event (cudaStreamWaitEvent), never a host
// sync, except Finish(), which waits for the copies. The compute stream may be the
// engine's own (torch's current stream), wrapped with
// gpu::Runtime::WrapExternalStream. Both run on the gpu
// module's runtime: CUDA, or host emulation (tests, CI).
//
// Thread-safety: a loader or storer is not thread-safe; use one per request
// in flight. GpuArena is thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "kvtier/arena.h"
#include "kvtier/client.h"
#include "kvtier/gpu/kv_layout.h"
#include "kvtier/gpu/kv_transfer.h"
#include "kvtier/gpu/layerwise_load.h"
#include "kvtier/gpu/layerwise_store.h"
#include "kvtier/gpu/runtime.h"

namespace kvtier {

// A gpu::GpuStatus as a Status: INVALID_ARGUMENT, RESOURCE_EXHAUSTED (out of
// memory) or UNAVAILABLE (any device trouble), the message led by `what`.
Status FromGpu(const gpu::GpuStatus& st, const std::string& what);

// The engine's paged KV cache: one layout for every layer (shape, strides in
// elements, element size; see gpu/kv_layout.h for the presets) and each
// layer's device tensors (K and V, or one tensor for MLA and flash-attn).
struct PagedKvCache {
  gpu::KvLayoutSpec layout;
  std::vector<gpu::LayerTensors> layers;  // one per model layer, in payload order
  // KV cache groups, each with a block table of its own (vLLM's hybrid allocator:
  // full-attention and sliding-window layers): group g is the next group_layers[g]
  // entries of `layers`, and a chunk payload holds the groups one after another
  // in this order (docs/HYBRID.md). Empty: one group of every layer.
  std::vector<uint32_t> group_layers = {};
};

// The layers of each KV cache group of `cache`, in group order: group_layers, or one
// group of every layer when it is empty. InvalidArgument when a group has 0 layers or
// the groups do not add up to cache.layers.size().
Result<std::vector<uint32_t>> KvCacheGroups(const PagedKvCache& cache);

// One engine block table per KV cache group of a PagedKvCache, in group order.
using BlockTables = std::span<const std::vector<int32_t>>;

// The client's mapping of kvtierd's arena, registered with a GPU runtime
// (cudaHostRegister in pieces of at most 64 GiB) the first time a load or
// store sees it, and the daemon's HBM pool, opened once (CUDA IPC). A daemon
// restart brings a new mapping and pool: they are registered and opened too,
// and the old ones are let go once no load or store in flight uses them.
// REQUIRES: the runtime outlives it, and no copy is in flight when it ends.
class GpuArena {
 public:
  explicit GpuArena(gpu::Runtime& runtime) : runtime_(runtime), scratch_(runtime) {}

  // The registration of `mapping`, held while the result lives. Errors:
  // RESOURCE_EXHAUSTED or UNAVAILABLE when the runtime refuses to register it.
  Result<std::shared_ptr<const gpu::PinnedRange>> For(const std::shared_ptr<Arena>& mapping);

  // The daemon's HBM pool, opened with the runtime the first time (a failure
  // is remembered: loads then copy from DRAM). Errors: FAILED_PRECONDITION
  // (a pool of the other backend than the runtime's), INVALID_ARGUMENT or
  // UNAVAILABLE from opening it (CUDA IPC needs the same machine, and a
  // process other than the daemon).
  Result<std::shared_ptr<const gpu::DeviceBuffer>> Pool(const HbmPoolInfo& pool);

  // Device buffers the loads and stores borrow (staging, address arrays) unless their
  // KvTransferOptions name another cache: no request frees device memory (cudaFree
  // synchronizes the device). Loaders and storers must not outlive the GpuArena.
  gpu::BufferCache& scratch() { return scratch_; }

  // Arena registrations and opened pools held now (observability, tests).
  size_t held_arenas() const;
  size_t held_pools() const;

 private:
  // REQUIRES: mu_ held. Drops the registrations of mappings no client and no
  // load or store uses any more (a daemon restarted), and the pools of those
  // daemon runs that nothing uses.
  void DropStale();

  struct OpenedPool {
    std::string ipc_handle;
    uint64_t epoch = 0;        // of the daemon run that exported it
    gpu::DeviceBuffer buffer;  // empty when opening failed
    Status error;
  };
  struct Entry {
    std::shared_ptr<Arena> mapping;  // kept mapped while registered
    gpu::PinnedRange range;
  };
  gpu::Runtime& runtime_;
  gpu::BufferCache scratch_;
  mutable std::mutex mu_;
  // Shared with the loads and stores using them: an entry no one else holds
  // and that is not the daemon's current one is dropped.
  std::vector<std::shared_ptr<Entry>> entries_;     // GUARDED_BY(mu_)
  std::vector<std::shared_ptr<OpenedPool>> pools_;  // GUARDED_BY(mu_)
};

// Loads the cached prefix of one request layer by layer.
class LayerwiseLoader {
 public:
  // `cache` must match `ns`: its layout's bytes per layer and token times
  // ns.spec.num_layers equal the chunk payload (checked by StartLoad).
  LayerwiseLoader(Client& client, NamespaceHandle ns, GpuArena& arena, PagedKvCache cache,
                  gpu::Runtime& runtime, gpu::KvTransferOptions options = {});
  ~LayerwiseLoader();  // waits for copies in flight, then releases the lease

  // Leases every chunk of the cached prefix of `tokens` first (Lookup with
  // acquire, or taking over `ticket`; chunks with an HBM copy are copied
  // device to device from the daemon's pool), then queues the copies of the
  // first layers into the engine blocks `block_ids` (the prompt's block table:
  // block_ids[j] holds tokens [j * block_size, (j + 1) * block_size)) on
  // `load_stream`, one event per layer; WaitLayer queues the later layers
  // (options.queue_ahead_layers ahead of it) and Finish the rest, so only after
  // Finish is the whole prefix in the cache. Chunks before `first_chunk` are already in the
  // engine's blocks (its own prefix cache hit: num_computed_tokens /
  // chunk_tokens): they are leased, not copied. A block id of -1
  // (gpu::kSkipBlock) leaves that block untouched: pass it for the blocks of
  // the engine's own hit inside the first copied chunk when that hit does
  // not end on a chunk boundary. Returns the tokens cached
  // through this load (engine's and copied, whole chunks), no more than
  // `block_ids` covers; below first_chunk * chunk_tokens nothing was copied. A
  // miss or an unreachable daemon delivers 0 tokens (no error). Errors:
  // INVALID_ARGUMENT (a layout that does not match the namespace or fails
  // validation, a load already started), UNAVAILABLE when the GPU runtime
  // refuses the copies (nothing leased then). `request_id`: as Client::Acquire.
  Result<uint64_t> StartLoad(std::span<const int32_t> tokens, std::span<const int32_t> block_ids,
                             gpu::Stream& load_stream, const PrefetchTicket* ticket = nullptr,
                             size_t first_chunk = 0, std::string_view request_id = {});
  // The same with a block table per KV cache group (cache.group_layers): each
  // group's layers are copied into its own table's blocks, and the load covers
  // the chunks every table covers. Also INVALID_ARGUMENT when the number of
  // tables is not the number of groups.
  Result<uint64_t> StartLoad(std::span<const int32_t> tokens, BlockTables block_tables,
                             gpu::Stream& load_stream, const PrefetchTicket* ticket = nullptr,
                             size_t first_chunk = 0, std::string_view request_id = {});

  // Queues the copies of the layers up to options.queue_ahead_layers past
  // `layer` not queued yet, and makes work queued on `compute_stream` from now
  // on wait until layer `layer` is in the cache (a stream wait; no host sync
  // on the copies). A layer with
  // nothing to load adds no wait. Errors: INVALID_ARGUMENT (layer out of range).
  Status WaitLayer(int64_t layer, gpu::Stream& compute_stream);

  // Queues the layers not queued yet, waits until every copy completed, then
  // releases the lease. Returns the
  // block ids the engine must recompute (ascending): chunks whose copy failed,
  // and chunks whose lease lapsed during the copy. With several groups, each
  // group's ids (ascending) follow the previous group's: ids are unique within
  // a group only. No other error reaches the engine. Errors: INVALID_ARGUMENT
  // when no load was started.
  Result<std::vector<int32_t>> Finish();

  // The event recorded after layer `layer`'s copies (once queued: see
  // WaitLayer); null when nothing loads.
  const gpu::Event* layer_event(int64_t layer) const;

  // Of the chunks StartLoad delivers, those copied from the HBM pool.
  uint32_t hbm_chunks() const { return hbm_chunks_; }

 private:
  Client& client_;
  const NamespaceHandle ns_;
  GpuArena& arena_;
  const PagedKvCache cache_;
  gpu::Runtime& runtime_;
  const gpu::KvTransferOptions options_;
  gpu::KvLayout layout_;
  std::vector<uint32_t> groups_;                   // layers per group
  std::vector<std::vector<int32_t>> block_ids_;    // per group, of the copied chunks
  std::shared_ptr<const gpu::PinnedRange> range_;  // held until the copies are done
  std::shared_ptr<const gpu::DeviceBuffer> pool_;  // the HBM pool the HBM chunks are read from
  ChunkLease lease_;
  std::vector<std::unique_ptr<gpu::LayerwiseLoad>> loads_;  // per group; empty: nothing loads
  gpu::Stream* load_stream_ = nullptr;
  uint32_t hbm_chunks_ = 0;
  uint32_t first_chunk_ = 0;  // the first leased chunk copied
  bool started_ = false;

  // Whether this load can read the daemon's HBM pool (it opens it).
  bool HbmUsable();
  // After the copies: how many leading chunks read from HBM still hold the
  // sequence they had at lookup (all of them unless a lease lapsed).
  uint32_t ValidHbmChunks();
};

// Stores the new chunks of one request layer by layer, as the engine writes them.
class LayerwiseStorer {
 public:
  LayerwiseStorer(Client& client, NamespaceHandle ns, GpuArena& arena, PagedKvCache cache,
                  gpu::Runtime& runtime, gpu::KvTransferOptions options = {});
  ~LayerwiseStorer();  // waits for copies in flight; aborts what was not committed

  // Reserves arena slots for the full chunks of `tokens` from `first_chunk` on
  // that are not cached; their KV will be in the engine blocks `block_ids`
  // (the prompt's block table). Returns how many chunks it will store (0 when
  // all are cached, or the daemon is unreachable). Errors: INVALID_ARGUMENT
  // (layout mismatch, `block_ids` too short, already started), UNAVAILABLE
  // when the GPU runtime refuses the copies (the reservation is dropped).
  Result<uint32_t> Start(std::span<const int32_t> tokens, std::span<const int32_t> block_ids,
                         gpu::Stream& store_stream, size_t first_chunk = 0);
  // The same with a block table per KV cache group (cache.group_layers), each
  // long enough for the full chunks. Also INVALID_ARGUMENT when the number of
  // tables is not the number of groups.
  Result<uint32_t> Start(std::span<const int32_t> tokens, BlockTables block_tables,
                         gpu::Stream& store_stream, size_t first_chunk = 0);

  // After the engine queued layer `layer`'s KV writes on `compute_stream`:
  // copies that layer of every new chunk into its slot on the store stream,
  // once those writes are done (a stream wait; no host sync). Each layer once.
  // Errors: INVALID_ARGUMENT (layer out of range or already done).
  Status LayerDone(int64_t layer, gpu::Stream& compute_stream);

  // Waits for every layer's copy, then commits the chunks, or aborts all of
  // them on any failure or missing layer (nothing half-written becomes
  // visible). Errors: INVALID_ARGUMENT when not started.
  Result<StoreResult> Finish();

 private:
  Client& client_;
  const NamespaceHandle ns_;
  GpuArena& arena_;
  const PagedKvCache cache_;
  gpu::Runtime& runtime_;
  const gpu::KvTransferOptions options_;
  gpu::KvLayout layout_;
  std::vector<uint32_t> groups_;                   // layers per group
  std::shared_ptr<const gpu::PinnedRange> range_;  // held until the copies are done
  ChunkReservation reservation_;
  std::vector<std::unique_ptr<gpu::LayerwiseStore>> stores_;  // per group; empty: nothing to store
  bool started_ = false;
};

}  // namespace kvtier
