#include "kvtier/gpu/kv_layout.h"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>

namespace kvtier::gpu {
namespace {

constexpr int64_t kMaxBlocks = std::numeric_limits<int32_t>::max();

std::vector<int64_t> RowMajorStrides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (size_t i = shape.size() - 1; i > 0; --i) strides[i - 1] = strides[i] * shape[i];
  return strides;
}

// Checks that no two in-range indices map to one offset: sorted by stride, each dimension
// of size > 1 must step past everything the smaller dimensions reach. Sets *span to
// 1 + the largest offset (elements). Returns an error message, or "" when valid.
std::string CheckStrides(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides,
                         int64_t* span) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size), size > 1 only.
  for (size_t i = 0; i < shape.size(); ++i) {
    if (strides[i] < 0) return "strides[" + std::to_string(i) + "] is negative";
    if (shape[i] > 1) dims.emplace_back(strides[i], shape[i]);
  }
  std::sort(dims.begin(), dims.end());
  __int128 reach = 0;  // Largest offset reachable with the dimensions checked so far.
  for (const auto& [stride, size] : dims) {
    if (stride <= reach) return "strides make two elements alias (overlapping dimensions)";
    reach += static_cast<__int128>(stride) * (size - 1);
    if (reach > std::numeric_limits<int64_t>::max() / 8) return "tensor too large";
  }
  *span = static_cast<int64_t>(reach) + 1;
  return "";
}

}  // namespace

std::string_view KvLayoutKindName(KvLayoutKind kind) {
  switch (kind) {
    case KvLayoutKind::kVllmFlashAttn:
      return "vllm_flash_attn";
    case KvLayoutKind::kVllmFlashInfer:
      return "vllm_flashinfer";
    case KvLayoutKind::kSglangMha:
      return "sglang_mha";
    case KvLayoutKind::kMla:
      return "mla";
    case KvLayoutKind::kVllmBhnc:
      return "vllm_bhnc";
  }
  return "unknown";
}

KvLayoutSpec KvLayoutSpec::VllmFlashAttn(int64_t num_blocks, int64_t block_size_tokens,
                                         int64_t num_kv_heads, int64_t head_dim,
                                         uint32_t elem_bytes) {
  KvLayoutSpec s;
  s.kind = KvLayoutKind::kVllmFlashAttn;
  s.num_blocks = num_blocks;
  s.block_size_tokens = block_size_tokens;
  s.num_kv_heads = num_kv_heads;
  s.head_dim = head_dim;
  s.elem_bytes = elem_bytes;
  return s;
}

KvLayoutSpec KvLayoutSpec::VllmFlashInfer(int64_t num_blocks, int64_t block_size_tokens,
                                          int64_t num_kv_heads, int64_t head_dim,
                                          uint32_t elem_bytes) {
  KvLayoutSpec s = VllmFlashAttn(num_blocks, block_size_tokens, num_kv_heads, head_dim, elem_bytes);
  s.kind = KvLayoutKind::kVllmFlashInfer;
  return s;
}

KvLayoutSpec KvLayoutSpec::SglangMha(int64_t num_blocks, int64_t page_size, int64_t num_kv_heads,
                                     int64_t head_dim, uint32_t elem_bytes) {
  KvLayoutSpec s = VllmFlashAttn(num_blocks, page_size, num_kv_heads, head_dim, elem_bytes);
  s.kind = KvLayoutKind::kSglangMha;
  return s;
}

KvLayoutSpec KvLayoutSpec::Mla(int64_t num_blocks, int64_t block_size_tokens, int64_t latent_dim,
                               uint32_t elem_bytes) {
  KvLayoutSpec s;
  s.kind = KvLayoutKind::kMla;
  s.num_blocks = num_blocks;
  s.block_size_tokens = block_size_tokens;
  s.latent_dim = latent_dim;
  s.elem_bytes = elem_bytes;
  return s;
}

KvLayoutSpec KvLayoutSpec::VllmBhnc(int64_t num_blocks, int64_t block_size_tokens,
                                    int64_t num_kv_heads, int64_t head_dim, uint32_t elem_bytes) {
  KvLayoutSpec s = VllmFlashAttn(num_blocks, block_size_tokens, num_kv_heads, head_dim, elem_bytes);
  s.kind = KvLayoutKind::kVllmBhnc;
  return s;
}

GpuStatus KvLayout::Create(const KvLayoutSpec& spec, KvLayout* out) {
  auto bad = [&spec](const std::string& msg) {
    return GpuStatus::InvalidArgument("KvLayout(" + std::string(KvLayoutKindName(spec.kind)) +
                                      "): " + msg);
  };
  if (out == nullptr) return GpuStatus::InvalidArgument("KvLayout::Create: out is null");
  if (spec.elem_bytes != 1 && spec.elem_bytes != 2 && spec.elem_bytes != 4) {
    return bad("elem_bytes must be 1, 2 or 4, not " + std::to_string(spec.elem_bytes));
  }
  if (spec.num_blocks <= 0 || spec.num_blocks > kMaxBlocks) {
    return bad("num_blocks must be in [1, 2^31 - 1], not " + std::to_string(spec.num_blocks));
  }
  if (spec.block_size_tokens <= 0 || spec.block_size_tokens > (int64_t{1} << 20)) {
    return bad("block_size_tokens must be in [1, 2^20], not " +
               std::to_string(spec.block_size_tokens));
  }
  const bool mla = spec.kind == KvLayoutKind::kMla;
  if (mla) {
    if (spec.latent_dim <= 0) return bad("latent_dim must be > 0");
    if (spec.num_kv_heads != 0 || spec.head_dim != 0) {
      return bad("num_kv_heads and head_dim must be 0 for MLA (use latent_dim)");
    }
  } else {
    if (spec.num_kv_heads <= 0) return bad("num_kv_heads must be > 0");
    if (spec.head_dim <= 0) return bad("head_dim must be > 0");
    if (spec.latent_dim != 0) return bad("latent_dim must be 0 for an MHA layout");
  }
  const int64_t nb = spec.num_blocks, bs = spec.block_size_tokens;
  const int64_t h = spec.num_kv_heads, d = spec.head_dim;

  KvLayout layout;
  layout.spec_ = spec;
  switch (spec.kind) {
    case KvLayoutKind::kVllmFlashAttn:
      layout.shape_ = {2, nb, bs, h, d};
      break;
    case KvLayoutKind::kVllmFlashInfer:
      layout.shape_ = {nb, 2, bs, h, d};
      break;
    case KvLayoutKind::kSglangMha:
      if (nb > std::numeric_limits<int64_t>::max() / bs) return bad("num_tokens overflows");
      layout.shape_ = {nb * bs, h, d};
      break;
    case KvLayoutKind::kMla:
      layout.shape_ = {nb, bs, spec.latent_dim};
      break;
    case KvLayoutKind::kVllmBhnc:
      if (d > std::numeric_limits<int64_t>::max() / 2) return bad("2 * head_dim overflows");
      layout.shape_ = {nb, h, bs, 2 * d};
      break;
    default:
      return bad("unknown kind");
  }
  if (spec.strides.empty()) {
    layout.strides_ = RowMajorStrides(layout.shape_);
  } else if (spec.strides.size() != layout.shape_.size()) {
    return bad("strides must have " + std::to_string(layout.shape_.size()) + " entries, not " +
               std::to_string(spec.strides.size()));
  } else {
    layout.strides_ = spec.strides;
  }
  int64_t span = 0;
  if (std::string err = CheckStrides(layout.shape_, layout.strides_, &span); !err.empty()) {
    return bad(err);
  }
  const std::vector<int64_t>& st = layout.strides_;
  layout.num_planes_ = mla ? 1 : 2;
  layout.num_tensors_ = spec.kind == KvLayoutKind::kSglangMha ? 2 : 1;
  layout.heads_ = mla ? 1 : h;
  layout.head_dim_ = mla ? spec.latent_dim : d;
  for (int t = 0; t < layout.num_tensors_; ++t) {
    layout.tensor_span_bytes_[t] = static_cast<size_t>(span) * spec.elem_bytes;
  }
  switch (spec.kind) {
    case KvLayoutKind::kVllmFlashAttn:
      for (int p = 0; p < 2; ++p) layout.planes_[p] = {0, p * st[0], st[1], st[2], st[3], st[4]};
      break;
    case KvLayoutKind::kVllmFlashInfer:
      for (int p = 0; p < 2; ++p) layout.planes_[p] = {0, p * st[1], st[0], st[2], st[3], st[4]};
      break;
    case KvLayoutKind::kSglangMha:
      for (int p = 0; p < 2; ++p) layout.planes_[p] = {p, 0, bs * st[0], st[0], st[1], st[2]};
      break;
    case KvLayoutKind::kMla:
      layout.planes_[0] = {0, 0, st[0], st[1], 0, st[2]};
      break;
    case KvLayoutKind::kVllmBhnc:  // K, then V, along the content dimension
      for (int p = 0; p < 2; ++p)
        layout.planes_[p] = {0, p * d * st[3], st[0], st[2], st[1], st[3]};
      break;
  }
  *out = std::move(layout);
  return GpuStatus::Ok();
}

size_t KvLayout::LayerPayloadBytes(int64_t chunk_tokens) const {
  return static_cast<size_t>(num_planes_) * static_cast<size_t>(chunk_tokens) *
         static_cast<size_t>(heads_) * static_cast<size_t>(head_dim_) * spec_.elem_bytes;
}

}  // namespace kvtier::gpu
