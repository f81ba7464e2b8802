#include "kv_copy_params.h"

#include <cstring>
#include <limits>
#include <string>

namespace kvtier::gpu {

std::string_view CopyPathName(CopyPath path) {
  return path == CopyPath::kDma ? "dma" : "zero_copy";
}

namespace internal {
namespace {

bool IsPowerOfTwo(size_t v) { return v != 0 && (v & (v - 1)) == 0; }

}  // namespace

GpuStatus BuildKvCopyParams(const KvLayerCopy& copy, KvCopyParams* out) {
  auto bad = [](const std::string& msg) {
    return GpuStatus::InvalidArgument("LaunchKvCopy: " + msg);
  };
  const KvLayout* layout = copy.layout;
  if (layout == nullptr || layout->num_planes() == 0) return bad("layout is null or invalid");
  const int64_t bs = layout->block_size_tokens();
  if (copy.chunk_tokens <= 0 || copy.chunk_tokens % bs != 0) {
    return bad("chunk_tokens " + std::to_string(copy.chunk_tokens) +
               " is not a positive multiple of block_size_tokens " + std::to_string(bs));
  }
  if (copy.num_chunks < 0) return bad("num_chunks is negative");
  if (copy.chunk_addrs == nullptr || copy.block_ids == nullptr) {
    return bad("chunk_addrs and block_ids must be non-null");
  }
  for (int t = 0; t < layout->num_tensors(); ++t) {
    if (copy.cache.tensors[t] == nullptr)
      return bad("cache.tensors[" + std::to_string(t) + "] is null");
  }
  if (!IsPowerOfTwo(copy.payload_align_bytes))
    return bad("payload_align_bytes is not a power of two");
  const int64_t e = layout->elem_bytes();
  const int64_t row_bytes = layout->head_dim() * e;
  const int64_t units_per_chunk_bound =
      layout->num_planes() * copy.chunk_tokens * layout->heads() * layout->head_dim();
  if (units_per_chunk_bound > std::numeric_limits<int32_t>::max() ||
      layout->heads() > std::numeric_limits<int32_t>::max()) {
    return bad("one chunk's layer slice is too large (more than 2^31 elements)");
  }

  KvCopyParams p{};
  for (int t = 0; t < 2; ++t) p.tensors[t] = static_cast<unsigned char*>(copy.cache.tensors[t]);
  p.num_planes = layout->num_planes();
  bool dim_contiguous = true;
  for (int i = 0; i < p.num_planes; ++i) {
    const KvPlane& q = layout->plane(i);
    p.planes[i] = {q.tensor, q.offset_elems * e, q.block_stride * e, q.token_stride * e,
                   q.head_stride * e};
    if (q.dim_stride != 1 && layout->head_dim() > 1) dim_contiguous = false;
  }
  int64_t unit = e;
  if (dim_contiguous) {
    for (int64_t w = 16; w > e; w /= 2) {
      bool fits = row_bytes % w == 0 && copy.payload_align_bytes % w == 0;
      for (int t = 0; t < layout->num_tensors(); ++t) {
        fits = fits && reinterpret_cast<uintptr_t>(copy.cache.tensors[t]) % w == 0;
      }
      for (int i = 0; i < p.num_planes; ++i) {
        const KvCopyPlaneParams& q = p.planes[i];
        fits = fits && q.offset_bytes % w == 0 && q.block_stride_bytes % w == 0 &&
               q.token_stride_bytes % w == 0 && q.head_stride_bytes % w == 0;
      }
      if (fits) {
        unit = w;
        break;
      }
    }
  }
  p.unit_bytes = static_cast<int32_t>(unit);
  p.units_per_row = static_cast<int32_t>(row_bytes / unit);
  p.unit_stride_bytes = dim_contiguous ? unit : layout->plane(0).dim_stride * e;
  p.row_bytes = row_bytes;
  p.heads = static_cast<int32_t>(layout->heads());
  p.chunk_tokens = copy.chunk_tokens;
  p.block_size = bs;
  p.blocks_per_chunk = copy.chunk_tokens / bs;
  p.num_chunks = copy.num_chunks;
  p.chunk_addrs = copy.chunk_addrs;
  p.payload_offset_bytes = copy.payload_offset_bytes;
  p.block_ids = copy.block_ids;
  p.to_cache = copy.direction == KvCopyDirection::kPayloadToCache;
  *out = p;
  return GpuStatus::Ok();
}

void RunKvCopyOnHost(const KvCopyParams& p) {
  const bool contiguous_row = p.unit_stride_bytes == p.unit_bytes;
  for (int64_t c = 0; c < p.num_chunks; ++c) {
    if (p.chunk_addrs[c] == 0) continue;
    auto* payload = reinterpret_cast<unsigned char*>(p.chunk_addrs[c] + p.payload_offset_bytes);
    const int32_t* blocks = p.block_ids + c * p.blocks_per_chunk;
    for (int32_t pl = 0; pl < p.num_planes; ++pl) {
      const KvCopyPlaneParams& q = p.planes[pl];
      for (int64_t t = 0; t < p.chunk_tokens; ++t) {
        if (blocks[t / p.block_size] < 0) continue;  // kSkipBlock
        unsigned char* cache_token = p.tensors[q.tensor] + q.offset_bytes +
                                     blocks[t / p.block_size] * q.block_stride_bytes +
                                     (t % p.block_size) * q.token_stride_bytes;
        unsigned char* pay_token = payload + (pl * p.chunk_tokens + t) * p.heads * p.row_bytes;
        for (int32_t h = 0; h < p.heads; ++h) {
          unsigned char* cache = cache_token + h * q.head_stride_bytes;
          unsigned char* pay = pay_token + h * p.row_bytes;
          if (contiguous_row) {
            if (p.to_cache)
              std::memcpy(cache, pay, p.row_bytes);
            else
              std::memcpy(pay, cache, p.row_bytes);
            continue;
          }
          for (int32_t u = 0; u < p.units_per_row; ++u) {
            unsigned char* cu = cache + u * p.unit_stride_bytes;
            unsigned char* pu = pay + static_cast<int64_t>(u) * p.unit_bytes;
            if (p.to_cache)
              std::memcpy(cu, pu, p.unit_bytes);
            else
              std::memcpy(pu, cu, p.unit_bytes);
          }
        }
      }
    }
  }
}

}  // namespace internal
}  // namespace kvtier::gpu
