#include "compute_params.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "half_convert.h"

namespace kvtier::gpu::engine {

std::string_view ScalarTypeName(ScalarType type) {
  return type == ScalarType::kFloat16 ? "fp16" : "bf16";
}

double PagedAttentionFlops(int64_t first_position, int64_t num_tokens, int64_t num_q_heads,
                           int64_t head_dim) {
  // sum_{i < n} (first + i + 1) = n * first + n (n + 1) / 2.
  const double n = static_cast<double>(num_tokens);
  const double keys = n * static_cast<double>(first_position) + n * (n + 1) / 2;
  return 4.0 * static_cast<double>(num_q_heads) * static_cast<double>(head_dim) * keys;
}

namespace internal {
namespace {

constexpr size_t kWorkspaceAlign = 256;

size_t AlignUp(size_t v) { return (v + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign; }

bool ValidType(ScalarType t) { return t == ScalarType::kFloat16 || t == ScalarType::kBFloat16; }

GpuStatus BuildPagedKv(const PagedKvView& view, const char* what, PagedKvParams* out) {
  auto bad = [what](const std::string& msg) {
    return GpuStatus::InvalidArgument(std::string(what) + ": " + msg);
  };
  const KvLayout* layout = view.layout;
  if (layout == nullptr || layout->num_planes() == 0) return bad("kv.layout is null or invalid");
  if (layout->kind() == KvLayoutKind::kMla || layout->num_planes() != 2) {
    return bad("kv.layout must be an MHA layout (K and V planes), not " +
               std::string(KvLayoutKindName(layout->kind())));
  }
  if (layout->elem_bytes() != 2) {
    return bad("kv.layout.elem_bytes is " + std::to_string(layout->elem_bytes()) +
               "; fp16/bf16 caches have 2");
  }
  for (int t = 0; t < layout->num_tensors(); ++t) {
    if (view.cache.tensors[t] == nullptr) {
      return bad("kv.cache.tensors[" + std::to_string(t) + "] is null");
    }
  }
  if (view.block_table == nullptr) return bad("kv.block_table is null");
  PagedKvParams p{};
  for (int t = 0; t < 2; ++t) p.tensors[t] = static_cast<uint16_t*>(view.cache.tensors[t]);
  for (int i = 0; i < 2; ++i) {
    const KvPlane& q = layout->plane(i);
    p.planes[i] = {q.tensor,       q.offset_elems, q.block_stride,
                   q.token_stride, q.head_stride,  q.dim_stride};
  }
  p.heads = layout->heads();
  p.head_dim = layout->head_dim();
  p.block_size = layout->block_size_tokens();
  p.block_table = view.block_table;
  *out = p;
  return GpuStatus::Ok();
}

// The positions a launch touches must have block-table entries that can exist: at most
// num_blocks blocks (distinct blocks; the table itself is device memory, unchecked).
GpuStatus CheckPositions(const KvLayout& layout, int64_t first, int64_t n, const char* what) {
  if (first < 0 || n < 0) {
    return GpuStatus::InvalidArgument(std::string(what) +
                                      ": first_position and num_tokens must be >= 0");
  }
  const int64_t end = first + n;
  const int64_t blocks = (end + layout.block_size_tokens() - 1) / layout.block_size_tokens();
  if (end < first || blocks > layout.num_blocks()) {
    return GpuStatus::InvalidArgument(
        std::string(what) + ": positions up to " + std::to_string(end) + " need " +
        std::to_string(blocks) + " blocks; the cache has " + std::to_string(layout.num_blocks()));
  }
  return GpuStatus::Ok();
}

}  // namespace

GpuStatus BuildGemmParams(const GemmArgs& args, GemmParams* out) {
  auto bad = [](const std::string& msg) {
    return GpuStatus::InvalidArgument("LaunchGemm: " + msg);
  };
  if (!ValidType(args.type)) return bad("type is not fp16 or bf16");
  if (args.m < 0 || args.n < 0 || args.k <= 0) return bad("m, n must be >= 0 and k > 0");
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();  // cuBLAS takes int sizes.
  if (args.m > kMax || args.n > kMax || args.k > kMax) return bad("m, n or k exceeds 2^31 - 1");
  GemmParams p{};
  p.type = args.type;
  p.m = args.m, p.n = args.n, p.k = args.k;
  p.lda = args.lda == 0 ? args.k : args.lda;
  p.ldb = args.ldb == 0 ? args.k : args.ldb;
  p.ldc = args.ldc == 0 ? args.n : args.ldc;
  if (p.lda < args.k || p.ldb < args.k || p.ldc < args.n || p.lda > kMax || p.ldb > kMax ||
      p.ldc > kMax) {
    return bad("lda/ldb must be in [k, 2^31) and ldc in [n, 2^31)");
  }
  if ((args.m > 0 || args.n > 0) && (args.a == nullptr || args.b == nullptr || args.c == nullptr)) {
    return bad("a, b and c must be non-null");
  }
  p.a = args.a, p.b = args.b, p.c = args.c;
  p.accumulate = args.accumulate;
  *out = p;
  return GpuStatus::Ok();
}

GpuStatus BuildKvAppendParams(const KvAppendArgs& args, KvAppendParams* out) {
  KvAppendParams p{};
  if (!ValidType(args.type)) return GpuStatus::InvalidArgument("LaunchKvAppend: bad type");
  if (GpuStatus s = BuildPagedKv(args.kv, "LaunchKvAppend", &p.kv); !s.ok()) return s;
  if (GpuStatus s =
          CheckPositions(*args.kv.layout, args.first_position, args.num_tokens, "LaunchKvAppend");
      !s.ok()) {
    return s;
  }
  const int64_t row = p.kv.heads * p.kv.head_dim;
  p.k_token_stride = args.k_token_stride == 0 ? row : args.k_token_stride;
  p.v_token_stride = args.v_token_stride == 0 ? row : args.v_token_stride;
  if (p.k_token_stride < row || p.v_token_stride < row) {
    return GpuStatus::InvalidArgument("LaunchKvAppend: k/v_token_stride below heads * head_dim (" +
                                      std::to_string(row) + ")");
  }
  if (args.num_tokens > 0 && (args.k == nullptr || args.v == nullptr)) {
    return GpuStatus::InvalidArgument("LaunchKvAppend: k and v must be non-null");
  }
  p.type = args.type;
  p.first_position = args.first_position;
  p.num_tokens = args.num_tokens;
  p.k = static_cast<const uint16_t*>(args.k);
  p.v = static_cast<const uint16_t*>(args.v);
  *out = p;
  return GpuStatus::Ok();
}

AttentionWorkspace PlanAttentionWorkspace(int64_t kv_heads, int64_t head_dim, int64_t q_heads,
                                          int64_t first_position, int64_t num_tokens) {
  const auto context = static_cast<size_t>(first_position + num_tokens);
  const auto tile = static_cast<size_t>(std::min(num_tokens, kAttentionQueryTileTokens));
  const size_t kv_bytes = static_cast<size_t>(kv_heads * head_dim) * context * 2;
  const size_t tile_elems = static_cast<size_t>(q_heads) * tile * context;
  AttentionWorkspace ws{};
  ws.k_offset = 0;
  ws.v_offset = AlignUp(kv_bytes);
  ws.scores_offset = ws.v_offset + AlignUp(kv_bytes);
  ws.probs_offset = ws.scores_offset + AlignUp(tile_elems * 4);
  ws.total_bytes = ws.probs_offset + AlignUp(tile_elems * 2);
  return ws;
}

GpuStatus BuildPagedAttentionParams(const PagedAttentionArgs& args, PagedAttentionParams* out) {
  auto bad = [](const std::string& msg) {
    return GpuStatus::InvalidArgument("LaunchPagedAttention: " + msg);
  };
  PagedAttentionParams p{};
  if (!ValidType(args.type)) return bad("type is not fp16 or bf16");
  if (GpuStatus s = BuildPagedKv(args.kv, "LaunchPagedAttention", &p.kv); !s.ok()) return s;
  if (GpuStatus s = CheckPositions(*args.kv.layout, args.first_position, args.num_tokens,
                                   "LaunchPagedAttention");
      !s.ok()) {
    return s;
  }
  if (args.num_q_heads <= 0 || args.num_q_heads % p.kv.heads != 0) {
    return bad("num_q_heads " + std::to_string(args.num_q_heads) +
               " is not a positive multiple of the cache's KV heads " + std::to_string(p.kv.heads));
  }
  const int64_t row = args.num_q_heads * p.kv.head_dim;
  p.q_token_stride = args.q_token_stride == 0 ? row : args.q_token_stride;
  p.out_token_stride = args.out_token_stride == 0 ? row : args.out_token_stride;
  if (p.q_token_stride < row || p.out_token_stride < row) {
    return bad("q/out_token_stride below num_q_heads * head_dim (" + std::to_string(row) + ")");
  }
  if (!(args.scale >= 0) || std::isinf(args.scale)) return bad("scale must be finite and >= 0");
  if (args.num_tokens > 0 && (args.q == nullptr || args.out == nullptr)) {
    return bad("q and out must be non-null");
  }
  p.ws = PlanAttentionWorkspace(p.kv.heads, p.kv.head_dim, args.num_q_heads, args.first_position,
                                args.num_tokens);
  if (args.num_tokens > 0 &&
      (args.workspace == nullptr || args.workspace_bytes < p.ws.total_bytes)) {
    return bad("workspace of " + std::to_string(args.workspace_bytes) + " bytes; " +
               std::to_string(p.ws.total_bytes) + " needed (PagedAttentionWorkspaceBytes)");
  }
  if (reinterpret_cast<uintptr_t>(args.workspace) % kWorkspaceAlign != 0) {
    return bad("workspace is not 256-byte aligned");
  }
  p.type = args.type;
  p.first_position = args.first_position;
  p.num_tokens = args.num_tokens;
  p.num_q_heads = args.num_q_heads;
  p.q = static_cast<const uint16_t*>(args.q);
  p.out = static_cast<uint16_t*>(args.out);
  p.scale = args.scale != 0
                ? args.scale
                : static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.kv.head_dim)));
  p.workspace = static_cast<unsigned char*>(args.workspace);
  p.tile_tokens = kAttentionQueryTileTokens;
  *out = p;
  return GpuStatus::Ok();
}

void RunGemmOnHost(const GemmParams& p) {
  const auto* a = static_cast<const uint16_t*>(p.a);
  const auto* b = static_cast<const uint16_t*>(p.b);
  auto* c = static_cast<uint16_t*>(p.c);
  std::vector<float> bf(static_cast<size_t>(p.n * p.k));
  for (int64_t j = 0; j < p.n; ++j) {
    for (int64_t x = 0; x < p.k; ++x) bf[j * p.k + x] = ScalarToFloat(p.type, b[j * p.ldb + x]);
  }
  std::vector<float> row(static_cast<size_t>(p.k));
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t x = 0; x < p.k; ++x) row[x] = ScalarToFloat(p.type, a[i * p.lda + x]);
    for (int64_t j = 0; j < p.n; ++j) {
      const float* w = &bf[j * p.k];
      float acc = 0;
      for (int64_t x = 0; x < p.k; ++x) acc += row[x] * w[x];
      if (p.accumulate) acc += ScalarToFloat(p.type, c[i * p.ldc + j]);
      c[i * p.ldc + j] = FloatToScalar(p.type, acc);
    }
  }
}

void RunKvAppendOnHost(const KvAppendParams& p) {
  for (int64_t i = 0; i < p.num_tokens; ++i) {
    const int64_t pos = p.first_position + i;
    for (int64_t h = 0; h < p.kv.heads; ++h) {
      for (int64_t d = 0; d < p.kv.head_dim; ++d) {
        const int64_t e = h * p.kv.head_dim + d;
        *PagedElement(p.kv, 0, pos, h, d) = p.k[i * p.k_token_stride + e];
        *PagedElement(p.kv, 1, pos, h, d) = p.v[i * p.v_token_stride + e];
      }
    }
  }
}

void RunPagedAttentionOnHost(const PagedAttentionParams& p) {
  const int64_t dim = p.kv.head_dim;
  const int64_t group = p.num_q_heads / p.kv.heads;
  const int64_t context = p.first_position + p.num_tokens;
  // K and V of the whole context as floats, [kv_heads][context][dim], converted once.
  std::vector<float> k(static_cast<size_t>(p.kv.heads * context * dim)), v(k.size());
  for (int64_t h = 0; h < p.kv.heads; ++h) {
    for (int64_t pos = 0; pos < context; ++pos) {
      for (int64_t d = 0; d < dim; ++d) {
        const size_t at = static_cast<size_t>((h * context + pos) * dim + d);
        k[at] = ScalarToFloat(p.type, *PagedElement(p.kv, 0, pos, h, d));
        v[at] = ScalarToFloat(p.type, *PagedElement(p.kv, 1, pos, h, d));
      }
    }
  }
  std::vector<float> scores(static_cast<size_t>(context));
  std::vector<float> q(static_cast<size_t>(dim)), acc(static_cast<size_t>(dim));
  for (int64_t i = 0; i < p.num_tokens; ++i) {
    const int64_t visible = p.first_position + i + 1;
    for (int64_t h = 0; h < p.num_q_heads; ++h) {
      const int64_t kvh = h / group;
      const uint16_t* qrow = p.q + i * p.q_token_stride + h * dim;
      for (int64_t d = 0; d < dim; ++d) q[d] = ScalarToFloat(p.type, qrow[d]);
      float max_score = -std::numeric_limits<float>::infinity();
      for (int64_t pos = 0; pos < visible; ++pos) {
        const float* krow = &k[static_cast<size_t>((kvh * context + pos) * dim)];
        float s = 0;
        for (int64_t d = 0; d < dim; ++d) s += q[d] * krow[d];
        scores[pos] = s * p.scale;
        max_score = std::max(max_score, scores[pos]);
      }
      float sum = 0;
      for (int64_t pos = 0; pos < visible; ++pos) {
        scores[pos] = std::exp(scores[pos] - max_score);
        sum += scores[pos];
      }
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t pos = 0; pos < visible; ++pos) {
        const float w = scores[pos] / sum;
        const float* vrow = &v[static_cast<size_t>((kvh * context + pos) * dim)];
        for (int64_t d = 0; d < dim; ++d) acc[d] += w * vrow[d];
      }
      uint16_t* orow = p.out + i * p.out_token_stride + h * dim;
      for (int64_t d = 0; d < dim; ++d) orow[d] = FloatToScalar(p.type, acc[d]);
    }
  }
}

}  // namespace internal

size_t PagedAttentionWorkspaceBytes(const PagedAttentionArgs& args) {
  const KvLayout* layout = args.kv.layout;
  if (layout == nullptr || layout->num_planes() != 2 || args.first_position < 0 ||
      args.num_tokens < 0 || args.num_q_heads <= 0) {
    return 0;
  }
  return internal::PlanAttentionWorkspace(layout->heads(), layout->head_dim(), args.num_q_heads,
                                          args.first_position, args.num_tokens)
      .total_bytes;
}

}  // namespace kvtier::gpu::engine
