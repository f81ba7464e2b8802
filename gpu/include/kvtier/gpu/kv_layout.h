// KvLayout: how one layer of an engine's paged KV cache sits in device memory, described by
// a preset's tensor shape plus strides, and how it maps onto kvtier's chunk payload.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "kvtier/gpu/gpu_status.h"

namespace kvtier::gpu {

// The engine tensor layouts kvtier understands. Shapes are per layer (engines keep one
// tensor, or one K and one V tensor, per layer). "heads" are KV heads of this TP rank.
enum class KvLayoutKind : uint8_t {
  // vLLM flash-attn: one tensor [2, num_blocks, block_size, heads, head_dim] (K then V).
  kVllmFlashAttn,
  // vLLM flashinfer: one tensor [num_blocks, 2, block_size, heads, head_dim].
  kVllmFlashInfer,
  // SGLang MHA token pool: two tensors, K and V, each [num_tokens, heads, head_dim], with
  // num_tokens = num_blocks * block_size (block_size = the page size; 1 allowed). Token slot
  // s of the pool is token (s % block_size) of block (s / block_size).
  kSglangMha,
  // MLA (vLLM and SGLang): one tensor [num_blocks, block_size, latent_dim], no K/V split.
  kMla,
  // vLLM's standardized per-layer view (vLLM >= 0.33, every MHA backend: flash-attn,
  // flashinfer, triton): one tensor [num_blocks, heads, block_size, 2 * head_dim], K in
  // content elements [0, head_dim) and V in [head_dim, 2 * head_dim). Its physical order
  // (NHD, HND, cross-layer) is in the strides.
  kVllmBhnc,
};

// "vllm_flash_attn", "vllm_flashinfer", "sglang_mha", "mla", "vllm_bhnc".
std::string_view KvLayoutKindName(KvLayoutKind kind);

// What the engine tells kvtier about one layer's cache tensor(s). Validated by
// KvLayout::Create. Use the factories below for the common cases.
struct KvLayoutSpec {
  // Which preset shape the strides refer to. Default: kVllmFlashAttn.
  KvLayoutKind kind = KvLayoutKind::kVllmFlashAttn;
  // Bytes per element: 1 (fp8/int8), 2 (fp16/bf16) or 4 (fp32). Default: 2.
  uint32_t elem_bytes = 2;
  // Blocks (pages) in the layer's tensor. SGLang: pool tokens / block_size_tokens.
  // Must be <= 2^31 - 1 (block ids are int32, as in vLLM's block tables). Default: 0 (invalid).
  int64_t num_blocks = 0;
  // Tokens per block (vLLM block_size, SGLang page_size); must divide chunk_tokens when the
  // layout is used for copies. Default: 16.
  int64_t block_size_tokens = 16;
  // KV heads of this rank. MHA presets only; must be 0 for kMla. Default: 0 (invalid).
  int64_t num_kv_heads = 0;
  // Elements per head. MHA presets only; must be 0 for kMla. Default: 0 (invalid).
  int64_t head_dim = 0;
  // Elements per token of the MLA latent (kv_lora_rank + rope dim, e.g. 576). kMla only.
  // Default: 0.
  int64_t latent_dim = 0;
  // Strides in elements of the preset's shape above, one per dimension (rank 5, 5, 3, 3, 4),
  // as torch's tensor.stride() reports them. Empty: contiguous row-major. A permuted stride
  // vector describes an HND cache ([.., heads, block_size, head_dim] in memory) with the
  // same logical shape; strides larger than contiguous describe padding or a cross-layer
  // tensor seen through a per-layer base address. Strides must not make two elements
  // alias. Default: empty.
  std::vector<int64_t> strides;

  static KvLayoutSpec VllmFlashAttn(int64_t num_blocks, int64_t block_size_tokens,
                                    int64_t num_kv_heads, int64_t head_dim, uint32_t elem_bytes);
  static KvLayoutSpec VllmFlashInfer(int64_t num_blocks, int64_t block_size_tokens,
                                     int64_t num_kv_heads, int64_t head_dim, uint32_t elem_bytes);
  // num_tokens = num_blocks * page_size tokens in each of the K and V tensors.
  static KvLayoutSpec SglangMha(int64_t num_blocks, int64_t page_size, int64_t num_kv_heads,
                                int64_t head_dim, uint32_t elem_bytes);
  static KvLayoutSpec Mla(int64_t num_blocks, int64_t block_size_tokens, int64_t latent_dim,
                          uint32_t elem_bytes);
  static KvLayoutSpec VllmBhnc(int64_t num_blocks, int64_t block_size_tokens, int64_t num_kv_heads,
                               int64_t head_dim, uint32_t elem_bytes);
};

// Where K (plane 0), V (plane 1) or the MLA latent (plane 0) of one layer lives: element
// (block b, token t of the block, head h, dim d) of the plane is element
// offset_elems + b*block_stride + t*token_stride + h*head_stride + d*dim_stride of tensor
// `tensor` (0 or 1). All strides and offsets in elements.
struct KvPlane {
  int tensor = 0;
  int64_t offset_elems = 0;
  int64_t block_stride = 0;
  int64_t token_stride = 0;
  int64_t head_stride = 0;
  int64_t dim_stride = 0;
};

// A validated layout of one layer. The chunk payload of one layer (DESIGN.md) is
// [num_planes][chunk_tokens][heads][head_dim] elements, contiguous: [K,V][tokens][heads][dim]
// for MHA, [tokens][latent_dim] for MLA (planes 1, heads 1, head_dim = latent_dim).
// Thread-safety: an immutable value type after Create.
class KvLayout {
 public:
  KvLayout() = default;  // Invalid until assigned from Create.

  // Validates `spec` into *out. Errors: kInvalidArgument naming the field (sizes <= 0,
  // elem_bytes not 1/2/4, wrong stride rank, negative strides, aliasing strides, tensor too
  // large for int64 byte offsets, fields set that the preset does not use).
  static GpuStatus Create(const KvLayoutSpec& spec, KvLayout* out);

  const KvLayoutSpec& spec() const { return spec_; }
  KvLayoutKind kind() const { return spec_.kind; }
  uint32_t elem_bytes() const { return spec_.elem_bytes; }
  int64_t num_blocks() const { return spec_.num_blocks; }
  int64_t block_size_tokens() const { return spec_.block_size_tokens; }
  // 2 (K, V) for MHA presets, 1 for MLA.
  int num_planes() const { return num_planes_; }
  // 2 for kSglangMha (K tensor, V tensor), else 1.
  int num_tensors() const { return num_tensors_; }
  // KV heads (1 for MLA) and elements per head (latent_dim for MLA).
  int64_t heads() const { return heads_; }
  int64_t head_dim() const { return head_dim_; }
  const KvPlane& plane(int p) const { return planes_[p]; }
  // The preset's logical shape and the (validated or derived) strides, in elements.
  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<int64_t>& strides() const { return strides_; }
  // Bytes tensor `t` must span from its base address: (1 + max element offset) * elem_bytes.
  size_t tensor_span_bytes(int t) const { return tensor_span_bytes_[t]; }

  // Bytes of one layer of one chunk in the payload: planes * chunk_tokens * heads *
  // head_dim * elem_bytes.
  size_t LayerPayloadBytes(int64_t chunk_tokens) const;

 private:
  KvLayoutSpec spec_;
  int num_planes_ = 0;
  int num_tensors_ = 0;
  int64_t heads_ = 0;
  int64_t head_dim_ = 0;
  std::array<KvPlane, 2> planes_{};
  std::vector<int64_t> shape_;
  std::vector<int64_t> strides_;
  std::array<size_t, 2> tensor_span_bytes_{};
};

}  // namespace kvtier::gpu
