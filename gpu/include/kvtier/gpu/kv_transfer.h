// KvTransfer: gather/scatter of one layer of many chunks between the engine's paged KV
// cache and chunk payloads in a registered host arena or a device memory pool, by either
// CopyPath.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kvtier/gpu/buffer_cache.h"
#include "kvtier/gpu/device_buffer.h"
#include "kvtier/gpu/gpu_status.h"
#include "kvtier/gpu/kv_copy.h"
#include "kvtier/gpu/kv_layout.h"
#include "kvtier/gpu/pinned_range.h"
#include "kvtier/gpu/runtime.h"

namespace kvtier::gpu {

// A block id that leaves its block out of a copy (see KvChunkSet::block_ids).
inline constexpr int32_t kSkipBlock = -1;

struct KvTransferOptions {
  // How bytes cross PCIe. Default: kDefaultCopyPath (kDma; see kv_copy.h for why).
  CopyPath path = kDefaultCopyPath;
  // kDma: device staging bytes; a layer is copied in batches of
  // max(1, max_staging_bytes / layer slice) chunks. Default: 256 MiB.
  size_t max_staging_bytes = size_t{256} << 20;
  // Where the transfer's device buffers (staging, the chunk-address and block-id arrays)
  // come from: lent by this cache and given back when the transfer ends, so that no
  // request pays a cudaFree (which synchronizes the device). Borrowed; must outlive the
  // transfer. Default: none (each transfer allocates and frees its own).
  BufferCache* scratch = nullptr;
  // LayerwiseLoad only: layers queued on the load stream beyond the one the engine last
  // waited for. Start queues this many, WaitLayer(i) tops the queue up to layer
  // i + queue_ahead_layers, and Finish queues the rest, so the engine's thread spends
  // one layer's queueing per layer, between its own launches. 0 queues every layer at
  // Start: on an H200, Start then blocked the engine's thread for 70 ms of a 96 ms load
  // (4,000 copies fill CUDA's launch queue) before its first compute launch, and layerwise
  // TTFT was 1.25x compute alone; with 2 it was 1.02x (docs/BENCHMARKS.md). Default: 2.
  int64_t queue_ahead_layers = 2;
};

// The chunks of one load or store, all in one namespace (one layout).
struct KvChunkSet {
  // Layout of every layer (engines use one layout for all layers). Borrowed: must outlive
  // the KvTransfer. Required.
  const KvLayout* layout = nullptr;
  // Layers in each payload. Required (> 0).
  int64_t num_layers = 0;
  // Tokens per chunk; a multiple of layout->block_size_tokens(). Required (> 0).
  int64_t chunk_tokens = 0;
  // The registration that contains the payloads not in device_pool. Borrowed: must outlive
  // the KvTransfer. Required unless device_pool is set.
  const PinnedRange* arena = nullptr;
  // Address of each chunk's payload: num_layers * layout->LayerPayloadBytes(chunk_tokens)
  // bytes, layer-major (DESIGN.md "chunk payload"), inside *arena or *device_pool.
  std::vector<void*> payloads;
  // [num_chunks][chunk_tokens / block_size] engine block ids, in token order: chunk c's
  // token t lives in block block_ids[c * blocks_per_chunk + t / block_size]. kSkipBlock (-1)
  // leaves that block out: a load does not write it (the engine holds those tokens already);
  // LayerwiseStore refuses it (the payload would keep stale bytes).
  std::vector<int32_t> block_ids;
  // Device memory that payloads may lie in instead of the arena (the daemon's HBM pool,
  // opened with Runtime::OpenExported), made by the same runtime. Borrowed: must outlive the
  // KvTransfer. Optional (last, so that brace-initialized sets need not name it). A payload
  // inside it is copied device to device: kDma copies its layer slice into staging with
  // CopyAsync; kZeroCopy lets the kernel read (or write) it where it is.
  const DeviceBuffer* device_pool = nullptr;
};

// One chunk whose copy failed. Its later layers are skipped: a load must recompute the
// chunk's blocks, a store must not commit the chunk.
struct ChunkCopyFailure {
  int64_t chunk_index = 0;  // Index into KvChunkSet::payloads.
  int64_t layer = 0;        // The first layer whose copy failed (0 when it failed at plan).
  GpuStatus status;
  std::vector<int32_t> block_ids;  // The chunk's engine block ids.
};

struct KvCopyReport {
  std::vector<ChunkCopyFailure> failed_chunks;  // Ascending chunk_index, each once.
  // The failed chunks' block ids, ascending and unique (vLLM's
  // get_block_ids_with_load_errors).
  std::vector<int32_t> FailedBlockIds() const;
};

// A plan for copying layers of a chunk set, bound to one stream. Create uploads the chunk
// address and block-id arrays (queued on the stream) and, for kDma, allocates staging;
// QueueLayer queues one layer of all chunks. Per-chunk failures seen when queueing (a copy
// or mapping the runtime refuses) mark that chunk failed and never stop the others.
// CUDA errors of queued work are not per chunk; the pipelines above attribute them.
// REQUIRES: the runtime, stream, layout, arena and device pool outlive it, and the stream's
// work is complete before it is destroyed (its device arrays and staging are freed).
// Thread-safety: not thread-safe.
class KvTransfer {
 public:
  // Errors: kInvalidArgument (a missing field, neither arena nor device_pool, an arena
  // registered with or a pool made by another runtime, a payload inside neither, a block
  // id out of [0, num_blocks), wrong block_ids size), kOutOfMemory, kDeviceError. A chunk
  // whose arena payload cannot be mapped for kZeroCopy is a failure at layer 0, not an
  // error.
  static GpuStatus Create(Runtime& runtime, KvChunkSet chunks, const KvTransferOptions& options,
                          Stream& stream, std::unique_ptr<KvTransfer>* out);

  // Queues layer `layer` of every chunk not yet failed. Errors: kInvalidArgument (layer out
  // of range, a null tensor), kDeviceError when a kernel launch fails (every remaining chunk
  // is then marked failed at this layer as well).
  GpuStatus QueueLayer(int64_t layer, KvCopyDirection direction, const LayerTensors& tensors);

  // Marks every chunk not yet failed as failed at `layer` with `status`.
  void FailRemaining(int64_t layer, const GpuStatus& status);

  // Failures so far, ascending chunk index.
  KvCopyReport Report() const;

  int64_t num_chunks() const { return static_cast<int64_t>(chunks_.payloads.size()); }
  const KvChunkSet& chunks() const { return chunks_; }
  size_t layer_bytes() const { return layer_bytes_; }
  CopyPath path() const { return options_.path; }
  Stream& stream() const { return *stream_; }

 private:
  KvTransfer(Runtime& runtime, KvChunkSet chunks, const KvTransferOptions& options, Stream& stream);
  GpuStatus Init();
  // `bytes` of device memory from options_.scratch, or allocated outright.
  GpuStatus Scratch(size_t bytes, ScratchBuffer* out);
  // Whether chunk `chunk`'s whole payload lies in chunks_.device_pool.
  bool InDevicePool(int64_t chunk) const;
  void MarkFailed(int64_t chunk, int64_t layer, GpuStatus status);
  GpuStatus Launch(int64_t first, int64_t count, int64_t layer, KvCopyDirection direction,
                   const LayerTensors& tensors);

  Runtime& runtime_;
  const KvChunkSet chunks_;
  const KvTransferOptions options_;
  Stream* const stream_;
  int64_t blocks_per_chunk_ = 0;
  size_t layer_bytes_ = 0;
  int64_t batch_chunks_ = 0;        // kDma: chunks per staging batch.
  size_t payload_align_bytes_ = 1;  // Of every address in addrs_ (+ layer offsets).
  std::vector<uint64_t> addrs_;     // Host copy of addrs_dev_ (kept alive for the upload).
  ScratchBuffer addrs_dev_;         // [num_chunks] staging slot or mapped payload; 0 = skip.
  ScratchBuffer block_ids_dev_;     // [num_chunks][blocks_per_chunk]
  ScratchBuffer staging_;           // kDma: [batch_chunks][layer_bytes]
  std::vector<GpuStatus> failed_;   // Per chunk: OK, or why it failed.
  std::vector<int64_t> failed_layer_;
};

}  // namespace kvtier::gpu
