#include "kvtier/gpu/engine/engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>

#include "status_context.h"

namespace kvtier::gpu::engine {
namespace {

// SplitMix64 finalizer: deterministic pseudo-random bits of (a, b).
uint64_t Mix(uint64_t a, uint64_t b) {
  uint64_t z = a * 0x9E3779B97F4A7C15ull + b + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

constexpr size_t kWeightTileElems = size_t{1} << 20;  // 2 MiB of fp16, repeated

}  // namespace

uint16_t ExactHalf(int32_t k, int shift) {
  if (k == 0) return 0;
  const uint16_t sign = k < 0 ? 0x8000 : 0;
  const uint32_t m = static_cast<uint32_t>(k < 0 ? -k : k);
  int e = 0;
  while ((m >> (e + 1)) != 0) ++e;  // e = floor(log2 m), m < 2048 so e <= 10
  const auto exponent = static_cast<uint16_t>(e - shift + 15);
  const auto mantissa = static_cast<uint16_t>((m << (10 - e)) & 0x3FF);
  return static_cast<uint16_t>(sign | (exponent << 10) | mantissa);
}

float HalfToFloat(uint16_t bits) {
  const int exp = (bits >> 10) & 31, mant = bits & 1023;
  float v = exp == 0 ? std::ldexp(static_cast<float>(mant), -24)
                     : std::ldexp(static_cast<float>(1024 + mant), exp - 25);
  if (exp == 31) v = mant == 0 ? INFINITY : NAN;
  return (bits & 0x8000) ? -v : v;
}

int64_t PagedCache::RowOffsetBytes(int plane, int64_t position) const {
  const KvPlane& p = layout.plane(plane);
  const int64_t block = block_table[position / layout.block_size_tokens()];
  return (p.offset_elems + block * p.block_stride +
          (position % layout.block_size_tokens()) * p.token_stride) *
         2;
}

GpuStatus Engine::Create(Runtime& runtime, const ModelShape& shape, std::span<const int32_t> prompt,
                         Stream& stream, std::unique_ptr<Engine>* out) {
  if (out == nullptr) return GpuStatus::InvalidArgument("Engine::Create: null out");
  if (prompt.empty()) return GpuStatus::InvalidArgument("the prompt is empty");
  std::unique_ptr<Engine> engine(new Engine(runtime, shape, static_cast<int64_t>(prompt.size())));
  KVTIER_ENGINE_RETURN_IF_ERROR(engine->Allocate(prompt, stream));
  *out = std::move(engine);
  return GpuStatus::Ok();
}

GpuStatus Engine::Allocate(std::span<const int32_t> prompt, Stream& stream) {
  const ModelShape& s = shape_;
  const int64_t t = max_tokens_;
  auto alloc = [&](DeviceBuffer* b, int64_t elems, const char* what) {
    return internal::WithContext(runtime_.Allocate(static_cast<size_t>(elems) * 2, b),
                                 std::string("allocating ") + what);
  };
  KVTIER_ENGINE_RETURN_IF_ERROR(alloc(&w_qkv_, s.qkv_dim() * s.hidden, "W_qkv"));
  KVTIER_ENGINE_RETURN_IF_ERROR(alloc(&w_o_, s.hidden * s.num_q_heads * s.head_dim, "W_o"));
  KVTIER_ENGINE_RETURN_IF_ERROR(alloc(&w_gate_up_, 2 * s.intermediate * s.hidden, "W_gate_up"));
  KVTIER_ENGINE_RETURN_IF_ERROR(alloc(&w_down_, s.hidden * s.intermediate, "W_down"));
  KVTIER_ENGINE_RETURN_IF_ERROR(alloc(&w_lm_, s.vocab * s.hidden, "W_lm"));
  KVTIER_ENGINE_RETURN_IF_ERROR(alloc(&embeddings_, t * s.hidden, "embeddings"));
  KVTIER_ENGINE_RETURN_IF_ERROR(alloc(&x_, t * s.hidden, "hidden states"));
  KVTIER_ENGINE_RETURN_IF_ERROR(alloc(&qkv_, t * s.qkv_dim(), "qkv"));
  KVTIER_ENGINE_RETURN_IF_ERROR(alloc(&attn_, t * s.num_q_heads * s.head_dim, "attention output"));
  KVTIER_ENGINE_RETURN_IF_ERROR(alloc(&o_, t * s.hidden, "o"));
  KVTIER_ENGINE_RETURN_IF_ERROR(alloc(&gate_up_, t * 2 * s.intermediate, "gate_up"));
  KVTIER_ENGINE_RETURN_IF_ERROR(alloc(&logits_, s.vocab, "logits"));

  // Weights: a tile of uniform values k / 4096, |k| <= r, repeated through each matrix, with
  // r = 4096 sqrt(3 gain / in_features): variance gain / in_features, so a GEMM multiplies
  // the activations' variance by about `gain` (1; 1/8 for W_down, which feeds the residual).
  struct Weight {
    DeviceBuffer* buffer;
    int64_t in_features;
    double gain;
  };
  std::vector<std::vector<uint16_t>> tiles;  // kept until the copies ran
  tiles.reserve(5);
  for (const Weight& w :
       {Weight{&w_qkv_, s.hidden, 1}, Weight{&w_o_, s.num_q_heads * s.head_dim, 1},
        Weight{&w_gate_up_, s.hidden, 1}, Weight{&w_down_, s.intermediate, 0.125},
        Weight{&w_lm_, s.hidden, 1}}) {
    const auto r = static_cast<int32_t>(
        std::min(2047.0, 4096 * std::sqrt(3 * w.gain / static_cast<double>(w.in_features))));
    std::vector<uint16_t>& tile = tiles.emplace_back(kWeightTileElems);
    for (size_t i = 0; i < tile.size(); ++i) {
      tile[i] = ExactHalf(static_cast<int32_t>(Mix(tiles.size(), i) % (2 * r + 1)) - r, 12);
    }
    for (size_t at = 0; at < w.buffer->size_bytes(); at += tile.size() * 2) {
      const size_t bytes = std::min(tile.size() * 2, w.buffer->size_bytes() - at);
      KVTIER_ENGINE_RETURN_IF_ERROR(internal::WithContext(
          runtime_.CopyAsync(static_cast<char*>(w.buffer->data()) + at, tile.data(), bytes, stream),
          "uploading weights"));
    }
  }
  // Embeddings: row of token id v holds values in +-1 that depend on (v, column) only.
  std::vector<uint16_t> rows(static_cast<size_t>(t * s.hidden));
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t e = 0; e < s.hidden; ++e) {
      rows[i * s.hidden + e] =
          ExactHalf(static_cast<int32_t>(Mix(static_cast<uint32_t>(prompt[i]), e) % 129) - 64, 6);
    }
  }
  KVTIER_ENGINE_RETURN_IF_ERROR(internal::WithContext(
      runtime_.CopyAsync(embeddings_.data(), rows.data(), rows.size() * 2, stream),
      "uploading embeddings"));

  PagedAttentionArgs full;
  KvLayout layout;
  KVTIER_ENGINE_RETURN_IF_ERROR(internal::WithContext(
      KvLayout::Create(KvLayoutSpec::VllmFlashAttn((t + kBlockTokens - 1) / kBlockTokens,
                                                   kBlockTokens, s.num_kv_heads, s.head_dim, 2),
                       &layout),
      "cache layout"));
  full.kv.layout = &layout;
  full.first_position = 0;
  full.num_tokens = t;
  full.num_q_heads = s.num_q_heads;
  const size_t ws = PagedAttentionWorkspaceBytes(full);
  KVTIER_ENGINE_RETURN_IF_ERROR(
      internal::WithContext(runtime_.Allocate(ws, &workspace_), "allocating workspace"));
  // The host vectors above must live until the copies ran.
  return internal::WithContext(runtime_.Synchronize(stream), "uploading weights");
}

GpuStatus Engine::CreateCache(uint32_t seed, PagedCache* out) {
  const ModelShape& s = shape_;
  const int64_t blocks = (max_tokens_ + kBlockTokens - 1) / kBlockTokens;
  PagedCache c;
  c.spec = KvLayoutSpec::VllmFlashAttn(blocks, kBlockTokens, s.num_kv_heads, s.head_dim, 2);
  KVTIER_ENGINE_RETURN_IF_ERROR(
      internal::WithContext(KvLayout::Create(c.spec, &c.layout), "cache layout"));
  c.layers.resize(static_cast<size_t>(s.num_layers));
  c.layer_tensors.resize(static_cast<size_t>(s.num_layers));
  for (int64_t l = 0; l < s.num_layers; ++l) {
    KVTIER_ENGINE_RETURN_IF_ERROR(internal::WithContext(
        runtime_.Allocate(c.layout.tensor_span_bytes(0), &c.layers[l]), "allocating the KV cache"));
    c.layer_tensors[l].tensors[0] = c.layers[l].data();
  }
  c.block_table.resize(static_cast<size_t>(blocks));
  std::iota(c.block_table.begin(), c.block_table.end(), 0);
  std::shuffle(c.block_table.begin(), c.block_table.end(), std::mt19937(seed));
  KVTIER_ENGINE_RETURN_IF_ERROR(
      internal::WithContext(runtime_.Allocate(c.block_table.size() * 4, &c.block_table_device),
                            "allocating the block table"));
  Stream stream;
  KVTIER_ENGINE_RETURN_IF_ERROR(
      internal::WithContext(runtime_.CreateStream(&stream), "creating a stream"));
  KVTIER_ENGINE_RETURN_IF_ERROR(
      internal::WithContext(runtime_.CopyAsync(c.block_table_device.data(), c.block_table.data(),
                                               c.block_table.size() * 4, stream),
                            "uploading the block table"));
  KVTIER_ENGINE_RETURN_IF_ERROR(ClearCache(c, stream));
  KVTIER_ENGINE_RETURN_IF_ERROR(
      internal::WithContext(runtime_.Synchronize(stream), "creating the cache"));
  *out = std::move(c);
  return GpuStatus::Ok();
}

GpuStatus Engine::ClearCache(PagedCache& cache, Stream& stream) {
  for (DeviceBuffer& layer : cache.layers) {
    KVTIER_ENGINE_RETURN_IF_ERROR(internal::WithContext(
        runtime_.LaunchMemset(layer.data(), 0, layer.size_bytes(), stream), "clearing the cache"));
  }
  return GpuStatus::Ok();
}

GpuStatus Engine::Gemm(const void* a, int64_t lda, const DeviceBuffer& w, int64_t n, int64_t k,
                       void* c, int64_t m, Stream& stream, bool accumulate) {
  GemmArgs g;
  g.type = ScalarType::kFloat16;
  g.m = m, g.n = n, g.k = k;
  g.a = a, g.lda = lda;
  g.b = w.data();
  g.c = c;
  g.accumulate = accumulate;
  return internal::WithContext(compute_.LaunchGemm(g, stream), "GEMM");
}

GpuStatus Engine::MlpAndOutput(int64_t n, Stream& stream) {
  const ModelShape& s = shape_;
  KVTIER_ENGINE_RETURN_IF_ERROR(
      Gemm(attn_.data(), 0, w_o_, s.hidden, s.num_q_heads * s.head_dim, o_.data(), n, stream));
  KVTIER_ENGINE_RETURN_IF_ERROR(
      Gemm(o_.data(), 0, w_gate_up_, 2 * s.intermediate, s.hidden, gate_up_.data(), n, stream));
  // down reads the first `intermediate` columns of gate_up (the "up" half; no SiLU).
  return Gemm(gate_up_.data(), 2 * s.intermediate, w_down_, s.hidden, s.intermediate, x_.data(), n,
              stream, /*accumulate=*/true);
}

GpuStatus Engine::Forward(PagedCache& cache, int64_t first, int64_t n, Stream& stream,
                          const LayerHooks& hooks) {
  const ModelShape& s = shape_;
  if (first < 0 || n <= 0 || first + n > max_tokens_) {
    return GpuStatus::InvalidArgument(
        "Forward: tokens [" + std::to_string(first) + ", " + std::to_string(first + n) +
        ") are not inside the prompt of " + std::to_string(max_tokens_));
  }
  auto* qkv = static_cast<uint16_t*>(qkv_.data());
  const int64_t q_cols = s.num_q_heads * s.head_dim, kv_cols = s.num_kv_heads * s.head_dim;
  // The residual stream starts as the new tokens' embeddings.
  KVTIER_ENGINE_RETURN_IF_ERROR(internal::WithContext(
      runtime_.CopyAsync(x_.data(),
                         static_cast<const uint16_t*>(embeddings_.data()) + first * s.hidden,
                         static_cast<size_t>(n * s.hidden) * 2, stream),
      "embedding"));
  for (int64_t l = 0; l < s.num_layers; ++l) {
    KVTIER_ENGINE_RETURN_IF_ERROR(
        Gemm(x_.data(), 0, w_qkv_, s.qkv_dim(), s.hidden, qkv, n, stream));
    PagedKvView kv;
    kv.layout = &cache.layout;
    kv.cache.tensors[0] = cache.layers[l].data();
    kv.block_table = static_cast<const int32_t*>(cache.block_table_device.data());
    KvAppendArgs append;
    append.kv = kv;
    append.first_position = first;
    append.num_tokens = n;
    append.k = qkv + q_cols;
    append.k_token_stride = s.qkv_dim();
    append.v = qkv + q_cols + kv_cols;
    append.v_token_stride = s.qkv_dim();
    KVTIER_ENGINE_RETURN_IF_ERROR(
        internal::WithContext(compute_.LaunchKvAppend(append, stream), "KV append"));
    if (hooks.after_kv_append) KVTIER_ENGINE_RETURN_IF_ERROR(hooks.after_kv_append(l));
    if (hooks.before_attention) KVTIER_ENGINE_RETURN_IF_ERROR(hooks.before_attention(l));
    PagedAttentionArgs att;
    att.kv = kv;
    att.first_position = first;
    att.num_tokens = n;
    att.num_q_heads = s.num_q_heads;
    att.q = qkv;
    att.q_token_stride = s.qkv_dim();
    att.out = attn_.data();
    att.workspace = workspace_.data();
    att.workspace_bytes = workspace_.size_bytes();
    KVTIER_ENGINE_RETURN_IF_ERROR(
        internal::WithContext(compute_.LaunchPagedAttention(att, stream), "attention"));
    KVTIER_ENGINE_RETURN_IF_ERROR(MlpAndOutput(n, stream));
  }
  return Gemm(static_cast<const uint16_t*>(x_.data()) + (n - 1) * s.hidden, 0, w_lm_, s.vocab,
              s.hidden, logits_.data(), 1, stream);
}

double Engine::ForwardFlops(int64_t first, int64_t n) const {
  const ModelShape& s = shape_;
  return static_cast<double>(s.num_layers) *
             (s.LayerGemmFlops(n) + PagedAttentionFlops(first, n, s.num_q_heads, s.head_dim)) +
         s.LmHeadFlops();
}

GpuStatus Engine::PlainGemms(int64_t n, Stream& stream) {
  const ModelShape& s = shape_;
  if (n <= 0 || n > max_tokens_) return GpuStatus::InvalidArgument("PlainGemms: bad token count");
  KVTIER_ENGINE_RETURN_IF_ERROR(
      internal::WithContext(runtime_.CopyAsync(x_.data(), embeddings_.data(),
                                               static_cast<size_t>(n * s.hidden) * 2, stream),
                            "embedding"));
  for (int64_t l = 0; l < s.num_layers; ++l) {
    KVTIER_ENGINE_RETURN_IF_ERROR(
        Gemm(x_.data(), 0, w_qkv_, s.qkv_dim(), s.hidden, qkv_.data(), n, stream));
    KVTIER_ENGINE_RETURN_IF_ERROR(MlpAndOutput(n, stream));
  }
  return Gemm(static_cast<const uint16_t*>(x_.data()) + (n - 1) * s.hidden, 0, w_lm_, s.vocab,
              s.hidden, logits_.data(), 1, stream);
}

double Engine::PlainGemmFlops(int64_t n) const {
  return static_cast<double>(shape_.num_layers) * shape_.LayerGemmFlops(n) + shape_.LmHeadFlops();
}

GpuStatus Engine::ReadLogits(Stream& stream, std::vector<float>* out) {
  std::vector<uint16_t> bits(static_cast<size_t>(shape_.vocab));
  KVTIER_ENGINE_RETURN_IF_ERROR(internal::WithContext(
      runtime_.CopyAsync(bits.data(), logits_.data(), bits.size() * 2, stream), "reading logits"));
  KVTIER_ENGINE_RETURN_IF_ERROR(
      internal::WithContext(runtime_.Synchronize(stream), "reading logits"));
  out->resize(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) (*out)[i] = HalfToFloat(bits[i]);
  return GpuStatus::Ok();
}

}  // namespace kvtier::gpu::engine
