#include "kvtier/gpu/kv_transfer.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

namespace kvtier::gpu {
namespace {

// Largest power of two (<= 256) dividing v; 256 for v == 0.
size_t LowBit(uint64_t v) {
  const uint64_t cap = Runtime::kDeviceAlignmentBytes;
  return v == 0 ? cap : static_cast<size_t>(std::min<uint64_t>(v & (~v + 1), cap));
}

// Source of the 8-byte stores that clear a failed chunk's entry in the address array.
constexpr uint64_t kZeroAddr = 0;

// Whether [p, p + bytes) lies inside `pool` (false for a null or empty pool).
bool InPool(const DeviceBuffer* pool, const void* p, size_t bytes) {
  if (pool == nullptr || pool->empty() || p == nullptr) return false;
  const auto start = reinterpret_cast<uintptr_t>(pool->data());
  const auto at = reinterpret_cast<uintptr_t>(p);
  return at >= start && at - start <= pool->size_bytes() &&
         bytes <= pool->size_bytes() - (at - start);
}

}  // namespace

std::vector<int32_t> KvCopyReport::FailedBlockIds() const {
  std::vector<int32_t> ids;
  for (const ChunkCopyFailure& f : failed_chunks) {
    for (int32_t id : f.block_ids) {
      if (id != kSkipBlock) ids.push_back(id);  // a skipped block was never written
    }
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

KvTransfer::KvTransfer(Runtime& runtime, KvChunkSet chunks, const KvTransferOptions& options,
                       Stream& stream)
    : runtime_(runtime), chunks_(std::move(chunks)), options_(options), stream_(&stream) {}

GpuStatus KvTransfer::Create(Runtime& runtime, KvChunkSet chunks, const KvTransferOptions& options,
                             Stream& stream, std::unique_ptr<KvTransfer>* out) {
  auto bad = [](const std::string& msg) {
    return GpuStatus::InvalidArgument("KvTransfer: " + msg);
  };
  if (out == nullptr) return bad("out is null");
  const KvLayout* layout = chunks.layout;
  if (layout == nullptr || layout->num_planes() == 0) return bad("layout is null or invalid");
  if (chunks.num_layers <= 0) return bad("num_layers must be > 0");
  if (chunks.chunk_tokens <= 0 || chunks.chunk_tokens % layout->block_size_tokens() != 0) {
    return bad("chunk_tokens must be a positive multiple of block_size_tokens");
  }
  if (chunks.arena == nullptr && chunks.device_pool == nullptr) {
    return bad("neither an arena nor a device_pool holds the payloads");
  }
  if (chunks.arena != nullptr && (chunks.arena->empty() || chunks.arena->runtime() != &runtime)) {
    return bad("arena is empty or registered with another runtime");
  }
  if (chunks.device_pool != nullptr &&
      (chunks.device_pool->empty() || chunks.device_pool->runtime() != &runtime)) {
    return bad("device_pool is empty or made by another runtime");
  }
  if (!stream.valid() || stream.runtime() != &runtime) return bad("stream is empty or foreign");
  const int64_t bpc = chunks.chunk_tokens / layout->block_size_tokens();
  const size_t payload_bytes = layout->LayerPayloadBytes(chunks.chunk_tokens) * chunks.num_layers;
  if (chunks.block_ids.size() != chunks.payloads.size() * bpc) {
    return bad("block_ids has " + std::to_string(chunks.block_ids.size()) + " entries, expected " +
               std::to_string(chunks.payloads.size() * bpc) + " (chunks x blocks per chunk)");
  }
  for (size_t c = 0; c < chunks.payloads.size(); ++c) {
    const void* payload = chunks.payloads[c];
    const bool in_arena = payload != nullptr && chunks.arena != nullptr &&
                          chunks.arena->Contains(payload, payload_bytes);
    if (!in_arena && !InPool(chunks.device_pool, payload, payload_bytes)) {
      return bad("payload of chunk " + std::to_string(c) + " (" + std::to_string(payload_bytes) +
                 " bytes) is not inside the " +
                 (chunks.device_pool == nullptr ? "arena"
                  : chunks.arena == nullptr     ? "device pool"
                                                : "arena or the device pool"));
    }
  }
  for (size_t i = 0; i < chunks.block_ids.size(); ++i) {
    if (chunks.block_ids[i] < kSkipBlock || chunks.block_ids[i] >= layout->num_blocks()) {
      return bad("block id " + std::to_string(chunks.block_ids[i]) + " of chunk " +
                 std::to_string(i / bpc) + " is outside [0, " +
                 std::to_string(layout->num_blocks()) + ") (or -1, skip)");
    }
  }
  std::unique_ptr<KvTransfer> transfer(new KvTransfer(runtime, std::move(chunks), options, stream));
  if (GpuStatus s = transfer->Init(); !s.ok()) return s;
  *out = std::move(transfer);
  return GpuStatus::Ok();
}

GpuStatus KvTransfer::Init() {
  const int64_t n = num_chunks();
  blocks_per_chunk_ = chunks_.chunk_tokens / chunks_.layout->block_size_tokens();
  layer_bytes_ = chunks_.layout->LayerPayloadBytes(chunks_.chunk_tokens);
  failed_.assign(n, GpuStatus::Ok());
  failed_layer_.assign(n, 0);
  if (n == 0) return GpuStatus::Ok();

  addrs_.assign(n, 0);
  payload_align_bytes_ = LowBit(layer_bytes_);
  if (options_.path == CopyPath::kZeroCopy) {
    for (int64_t c = 0; c < n; ++c) {
      // A payload in the device pool is device memory: the kernel reaches it where it is.
      void* device = chunks_.payloads[c];
      if (!InDevicePool(c)) {
        GpuStatus s = runtime_.MapHost(*chunks_.arena, chunks_.payloads[c],
                                       layer_bytes_ * chunks_.num_layers, &device);
        if (!s.ok()) {
          MarkFailed(c, 0, std::move(s));
          continue;
        }
      }
      addrs_[c] = reinterpret_cast<uint64_t>(device);
      payload_align_bytes_ = std::min(payload_align_bytes_, LowBit(addrs_[c]));
    }
  } else {
    batch_chunks_ = static_cast<int64_t>(
        std::clamp<size_t>(options_.max_staging_bytes / layer_bytes_, 1, static_cast<size_t>(n)));
    if (GpuStatus s = Scratch(batch_chunks_ * layer_bytes_, &staging_); !s.ok()) {
      return s;
    }
    const auto base = reinterpret_cast<uint64_t>(staging_.data());
    for (int64_t c = 0; c < n; ++c) addrs_[c] = base + (c % batch_chunks_) * layer_bytes_;
  }
  const size_t ids_bytes = chunks_.block_ids.size() * sizeof(int32_t);
  if (GpuStatus s = Scratch(n * sizeof(uint64_t), &addrs_dev_); !s.ok()) return s;
  if (GpuStatus s = Scratch(ids_bytes, &block_ids_dev_); !s.ok()) return s;
  if (GpuStatus s =
          runtime_.CopyAsync(addrs_dev_.data(), addrs_.data(), n * sizeof(uint64_t), *stream_);
      !s.ok()) {
    return s;
  }
  return runtime_.CopyAsync(block_ids_dev_.data(), chunks_.block_ids.data(), ids_bytes, *stream_);
}

bool KvTransfer::InDevicePool(int64_t chunk) const {
  return InPool(chunks_.device_pool, chunks_.payloads[chunk], layer_bytes_ * chunks_.num_layers);
}

GpuStatus KvTransfer::Scratch(size_t bytes, ScratchBuffer* out) {
  if (options_.scratch != nullptr) return options_.scratch->Take(bytes, out);
  DeviceBuffer own;
  if (GpuStatus s = runtime_.Allocate(bytes, &own); !s.ok()) return s;
  *out = ScratchBuffer(std::move(own));
  return GpuStatus::Ok();
}

void KvTransfer::MarkFailed(int64_t chunk, int64_t layer, GpuStatus status) {
  if (!failed_[chunk].ok()) return;
  failed_[chunk] = std::move(status);
  failed_layer_[chunk] = layer;
}

void KvTransfer::FailRemaining(int64_t layer, const GpuStatus& status) {
  for (int64_t c = 0; c < num_chunks(); ++c) MarkFailed(c, layer, status);
}

KvCopyReport KvTransfer::Report() const {
  KvCopyReport report;
  for (int64_t c = 0; c < num_chunks(); ++c) {
    if (failed_[c].ok()) continue;
    const auto first = chunks_.block_ids.begin() + c * blocks_per_chunk_;
    report.failed_chunks.push_back(ChunkCopyFailure{
        c, failed_layer_[c], failed_[c], std::vector<int32_t>(first, first + blocks_per_chunk_)});
  }
  return report;
}

GpuStatus KvTransfer::Launch(int64_t first, int64_t count, int64_t layer, KvCopyDirection direction,
                             const LayerTensors& tensors) {
  KvLayerCopy copy;
  copy.layout = chunks_.layout;
  copy.cache = tensors;
  copy.chunk_tokens = chunks_.chunk_tokens;
  copy.num_chunks = count;
  copy.chunk_addrs = static_cast<const uint64_t*>(addrs_dev_.data()) + first;
  copy.payload_offset_bytes = options_.path == CopyPath::kZeroCopy ? layer * layer_bytes_ : 0;
  copy.payload_align_bytes = payload_align_bytes_;
  copy.block_ids = static_cast<const int32_t*>(block_ids_dev_.data()) + first * blocks_per_chunk_;
  copy.direction = direction;
  GpuStatus s = runtime_.LaunchKvCopy(copy, *stream_);
  if (!s.ok()) FailRemaining(layer, s);
  return s;
}

GpuStatus KvTransfer::QueueLayer(int64_t layer, KvCopyDirection direction,
                                 const LayerTensors& tensors) {
  if (layer < 0 || layer >= chunks_.num_layers) {
    return GpuStatus::InvalidArgument("KvTransfer: layer " + std::to_string(layer) +
                                      " out of range");
  }
  for (int t = 0; t < chunks_.layout->num_tensors(); ++t) {
    if (tensors.tensors[t] == nullptr) {
      return GpuStatus::InvalidArgument("KvTransfer: layer tensor " + std::to_string(t) +
                                        " is null");
    }
  }
  const int64_t n = num_chunks();
  if (n == 0) return GpuStatus::Ok();
  if (options_.path == CopyPath::kZeroCopy) return Launch(0, n, layer, direction, tensors);

  const bool load = direction == KvCopyDirection::kPayloadToCache;
  auto* addrs_dev = static_cast<uint64_t*>(addrs_dev_.data());
  // One copy per chunk between its layer slice (host to device from the arena, device to
  // device from the pool) and its staging slot; a refused copy fails the chunk and clears
  // its address so that the kernel skips it from now on.
  auto copy_chunks = [&](int64_t first, int64_t count) -> GpuStatus {
    for (int64_t c = first; c < first + count; ++c) {
      if (!failed_[c].ok()) continue;
      auto* slot = reinterpret_cast<void*>(addrs_[c]);
      void* slice = static_cast<char*>(chunks_.payloads[c]) + layer * layer_bytes_;
      GpuStatus s = load ? runtime_.CopyAsync(slot, slice, layer_bytes_, *stream_)
                         : runtime_.CopyAsync(slice, slot, layer_bytes_, *stream_);
      if (s.ok()) continue;
      MarkFailed(c, layer, std::move(s));
      if (GpuStatus z = runtime_.CopyAsync(addrs_dev + c, &kZeroAddr, sizeof(kZeroAddr), *stream_);
          !z.ok()) {
        FailRemaining(layer, z);
        return z;
      }
    }
    return GpuStatus::Ok();
  };
  for (int64_t first = 0; first < n; first += batch_chunks_) {
    const int64_t count = std::min(batch_chunks_, n - first);
    if (load) {
      if (GpuStatus s = copy_chunks(first, count); !s.ok()) return s;
      if (GpuStatus s = Launch(first, count, layer, direction, tensors); !s.ok()) return s;
    } else {
      if (GpuStatus s = Launch(first, count, layer, direction, tensors); !s.ok()) return s;
      if (GpuStatus s = copy_chunks(first, count); !s.ok()) return s;
    }
  }
  return GpuStatus::Ok();
}

}  // namespace kvtier::gpu
