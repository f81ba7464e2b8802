// Shared by the KV gather/scatter and layerwise tests: page-aligned host memory, the layout
// cases, and a CPU reference of where each payload element lives in the engine's tensors,
// written from the preset shapes and strides alone (not from KvLayout's plane views).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "kvtier/gpu/kv_copy.h"
#include "kvtier/gpu/kv_layout.h"
#include "kvtier/gpu/runtime.h"

namespace kvtier::gpu {

// Readable test parameters in gtest failure messages.
inline void PrintTo(Backend backend, std::ostream* os) {
  *os << (backend == Backend::kHost ? "host" : "cuda");
}
inline void PrintTo(CopyPath path, std::ostream* os) { *os << CopyPathName(path); }

}  // namespace kvtier::gpu

namespace kvtier::gpu::testing {

// Page-aligned host memory, freed on destruction.
class HostMemory {
 public:
  explicit HostMemory(size_t bytes)
      : bytes_(bytes), data_(static_cast<uint8_t*>(std::aligned_alloc(4096, RoundUp(bytes)))) {}
  ~HostMemory() { std::free(data_); }
  HostMemory(const HostMemory&) = delete;
  HostMemory& operator=(const HostMemory&) = delete;
  uint8_t* data() const { return data_; }
  size_t size() const { return bytes_; }

 private:
  static size_t RoundUp(size_t b) { return (b + 4095) / 4096 * 4096; }
  size_t bytes_;
  uint8_t* data_;
};

// Layout shapes under test. "Hnd": heads before tokens in memory; "Padded": strides larger
// than contiguous; "DimMajor": head_dim is not the innermost dimension (dim stride != 1).
enum class KvCase {
  kFlashAttn,
  kFlashAttnHnd,
  kFlashInfer,
  kFlashInferPadded,
  kSglang,
  kSglangDimMajor,
  kMla,
  kMlaPadded,
  kBhnc,
  kBhncNhd,
};

inline std::string KvCaseName(KvCase c);
inline void PrintTo(KvCase c, std::ostream* os) { *os << KvCaseName(c); }

inline std::string KvCaseName(KvCase c) {
  switch (c) {
    case KvCase::kFlashAttn:
      return "FlashAttn";
    case KvCase::kFlashAttnHnd:
      return "FlashAttnHnd";
    case KvCase::kFlashInfer:
      return "FlashInfer";
    case KvCase::kFlashInferPadded:
      return "FlashInferPadded";
    case KvCase::kSglang:
      return "Sglang";
    case KvCase::kSglangDimMajor:
      return "SglangDimMajor";
    case KvCase::kMla:
      return "Mla";
    case KvCase::kMlaPadded:
      return "MlaPadded";
    case KvCase::kBhnc:
      return "Bhnc";
    case KvCase::kBhncNhd:
      return "BhncNhd";
  }
  return "Unknown";
}

constexpr int64_t kTestHeads = 2;
constexpr int64_t kTestHeadDim = 12;  // Rows of 12, 24, 48 bytes: 4, 8, 16-byte units.
constexpr int64_t kTestLatentDim = 36;

// The spec of a case; strides written out by hand from the physical order.
inline KvLayoutSpec MakeSpec(KvCase c, int64_t num_blocks, int64_t bs, uint32_t e) {
  const int64_t nb = num_blocks, h = kTestHeads, d = kTestHeadDim, l = kTestLatentDim;
  KvLayoutSpec s;
  switch (c) {
    case KvCase::kFlashAttn:
      return KvLayoutSpec::VllmFlashAttn(nb, bs, h, d, e);
    case KvCase::kFlashAttnHnd:  // Memory [2, nb, h, bs, d], logical [2, nb, bs, h, d].
      s = KvLayoutSpec::VllmFlashAttn(nb, bs, h, d, e);
      s.strides = {nb * h * bs * d, h * bs * d, d, bs * d, 1};
      return s;
    case KvCase::kFlashInfer:
      return KvLayoutSpec::VllmFlashInfer(nb, bs, h, d, e);
    case KvCase::kFlashInferPadded:  // Each head row padded to 16 elements, each block +8.
      s = KvLayoutSpec::VllmFlashInfer(nb, bs, h, d, e);
      s.strides = {2 * bs * h * 16 + 8, bs * h * 16 + 4, h * 16, 16, 1};
      return s;
    case KvCase::kSglang:
      return KvLayoutSpec::SglangMha(nb, bs, h, d, e);
    case KvCase::kSglangDimMajor:  // Memory [tokens, d, h].
      s = KvLayoutSpec::SglangMha(nb, bs, h, d, e);
      s.strides = {d * h, 1, h};
      return s;
    case KvCase::kMla:
      return KvLayoutSpec::Mla(nb, bs, l, e);
    case KvCase::kMlaPadded:  // Token rows of 40 elements, blocks +4.
      s = KvLayoutSpec::Mla(nb, bs, l, e);
      s.strides = {bs * 40 + 4, 40, 1};
      return s;
    case KvCase::kBhnc:
      return KvLayoutSpec::VllmBhnc(nb, bs, h, d, e);
    case KvCase::kBhncNhd:  // Memory [nb, bs, h, 2d] (vLLM's NHD), logical [nb, h, bs, 2d].
      s = KvLayoutSpec::VllmBhnc(nb, bs, h, d, e);
      s.strides = {bs * h * 2 * d, 2 * d, h * 2 * d, 1};
      return s;
  }
  return s;
}

inline bool IsMla(KvCase c) { return c == KvCase::kMla || c == KvCase::kMlaPadded; }
inline int NumTensors(KvCase c) {
  return c == KvCase::kSglang || c == KvCase::kSglangDimMajor ? 2 : 1;
}
inline int NumPlanes(KvCase c) { return IsMla(c) ? 1 : 2; }
inline int64_t RowElems(KvCase c) { return IsMla(c) ? kTestLatentDim : kTestHeads * kTestHeadDim; }

// Element offset in tensor *tensor of (plane p, block b, token t of the block, head h,
// dim d), from the preset's logical index and the spec's strides (row-major if empty).
inline int64_t RefOffset(const KvLayoutSpec& s, int p, int64_t b, int64_t t, int64_t h, int64_t d,
                         int* tensor) {
  std::vector<int64_t> idx, shape;
  *tensor = 0;
  switch (s.kind) {
    case KvLayoutKind::kVllmFlashAttn:
      idx = {p, b, t, h, d};
      shape = {2, s.num_blocks, s.block_size_tokens, s.num_kv_heads, s.head_dim};
      break;
    case KvLayoutKind::kVllmFlashInfer:
      idx = {b, p, t, h, d};
      shape = {s.num_blocks, 2, s.block_size_tokens, s.num_kv_heads, s.head_dim};
      break;
    case KvLayoutKind::kSglangMha:
      *tensor = p;
      idx = {b * s.block_size_tokens + t, h, d};
      shape = {s.num_blocks * s.block_size_tokens, s.num_kv_heads, s.head_dim};
      break;
    case KvLayoutKind::kMla:
      idx = {b, t, d};
      shape = {s.num_blocks, s.block_size_tokens, s.latent_dim};
      break;
    case KvLayoutKind::kVllmBhnc:
      idx = {b, h, t, p * s.head_dim + d};
      shape = {s.num_blocks, s.num_kv_heads, s.block_size_tokens, 2 * s.head_dim};
      break;
  }
  int64_t offset = 0, stride = 1;
  for (int i = static_cast<int>(idx.size()) - 1; i >= 0; --i) {
    offset += idx[i] * (s.strides.empty() ? stride : s.strides[i]);
    stride *= shape[i];
  }
  return offset;
}

// Calls fn(payload_byte_offset, tensor, tensor_byte_offset, elem_bytes) for every element
// of one layer slice of one chunk, in payload order [planes][tokens][heads][dim].
template <typename Fn>
void ForEachElement(const KvLayoutSpec& s, int64_t chunk_tokens, const int32_t* block_ids, Fn fn) {
  const bool mla = s.kind == KvLayoutKind::kMla;
  const int planes = mla ? 1 : 2;
  const int64_t heads = mla ? 1 : s.num_kv_heads, dim = mla ? s.latent_dim : s.head_dim;
  int64_t pay = 0;
  for (int p = 0; p < planes; ++p) {
    for (int64_t t = 0; t < chunk_tokens; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t d = 0; d < dim; ++d, ++pay) {
          int tensor = 0;
          const int64_t off = RefOffset(s, p, block_ids[t / s.block_size_tokens],
                                        t % s.block_size_tokens, h, d, &tensor);
          fn(pay * s.elem_bytes, tensor, off * s.elem_bytes, s.elem_bytes);
        }
      }
    }
  }
}

inline std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<uint8_t> out(n);
  for (auto& b : out) b = static_cast<uint8_t>(gen());
  return out;
}

// `num_chunks` chunks of distinct, shuffled block ids out of [0, num_blocks).
inline std::vector<int32_t> ShuffledBlockIds(int64_t num_blocks, int64_t count, uint32_t seed) {
  std::vector<int32_t> all(num_blocks);
  for (int64_t i = 0; i < num_blocks; ++i) all[i] = static_cast<int32_t>(i);
  std::shuffle(all.begin(), all.end(), std::mt19937(seed));
  all.resize(count);
  return all;
}

inline std::unique_ptr<Runtime> MakeRuntime(Backend backend, GpuStatus* status) {
  std::unique_ptr<Runtime> runtime;
  if (backend == Backend::kHost) return Runtime::CreateHost();
  *status = Runtime::CreateCuda(0, &runtime);
  return runtime;
}

}  // namespace kvtier::gpu::testing
