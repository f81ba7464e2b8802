// Behaviour every Runtime backend must show for Runtime::LaunchMemset and the test engine's
// Compute (LaunchGemm, LaunchKvAppend and LaunchPagedAttention). Expected values come from
// references written here: a 16-bit float decoder of its own, double-precision GEMM and attention
// over contiguous K/V, and the vLLM flash-attn cache layout [2, num_blocks, block_size, heads,
// head_dim] written out by hand.
#include "compute_behaviour_test.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "kvtier/gpu/engine/compute.h"
#include "kvtier/gpu/kv_layout.h"

namespace kvtier::gpu::testing {
namespace {

using engine::Compute;
using engine::GemmArgs;
using engine::kAttentionQueryTileTokens;
using engine::KvAppendArgs;
using engine::PagedAttentionArgs;
using engine::PagedAttentionWorkspaceBytes;
using engine::ScalarType;
using engine::ScalarTypeName;

// Decodes IEEE binary16 or bfloat16 bits (independent of the library's conversions).
double Decode(ScalarType t, uint16_t bits) {
  if (t == ScalarType::kBFloat16) {
    uint32_t u = uint32_t{bits} << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  const int sign = bits >> 15, exp = (bits >> 10) & 31, mant = bits & 1023;
  double v = exp == 0 ? std::ldexp(mant, -24) : std::ldexp(1024 + mant, exp - 25);
  if (exp == 31) v = mant == 0 ? INFINITY : NAN;
  return sign ? -v : v;
}

// Bits of `x`, which must be exactly representable (the test only uses k / 64, |k| <= 128).
uint16_t Encode(ScalarType t, double x) {
  static const auto* tables = [] {
    auto* m = new std::map<double, uint16_t>[2];
    for (uint32_t b = 0; b < 65536; ++b) {
      for (int i = 0; i < 2; ++i) {
        const double v =
            Decode(i == 0 ? ScalarType::kFloat16 : ScalarType::kBFloat16, static_cast<uint16_t>(b));
        if (std::isfinite(v) && !(v == 0 && (b & 0x8000))) m[i].emplace(v, b);
      }
    }
    return m;
  }();
  const auto& m = tables[t == ScalarType::kFloat16 ? 0 : 1];
  const auto it = m.find(x);
  return it == m.end() ? 0x7E00 : it->second;  // NaN when not exact (fails the test).
}

// Values k / 64 for k in [-range, range], exactly representable in fp16 and bf16.
std::vector<double> Values(size_t n, int range, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> dist(-range, range);
  std::vector<double> v(n);
  for (auto& x : v) x = dist(gen) / 64.0;
  return v;
}

class Fixture {
 public:
  explicit Fixture(Runtime& rt) : rt_(rt) { EXPECT_TRUE(rt_.CreateStream(&stream_).ok()); }

  // A device buffer holding `bits`.
  DeviceBuffer Upload(const std::vector<uint16_t>& bits) {
    DeviceBuffer b;
    EXPECT_TRUE(rt_.Allocate(bits.size() * 2, &b).ok());
    EXPECT_TRUE(rt_.CopyAsync(b.data(), bits.data(), bits.size() * 2, stream_).ok());
    EXPECT_TRUE(rt_.Synchronize(stream_).ok());
    return b;
  }
  DeviceBuffer UploadInts(const std::vector<int32_t>& v) {
    DeviceBuffer b;
    EXPECT_TRUE(rt_.Allocate(v.size() * 4, &b).ok());
    EXPECT_TRUE(rt_.CopyAsync(b.data(), v.data(), v.size() * 4, stream_).ok());
    EXPECT_TRUE(rt_.Synchronize(stream_).ok());
    return b;
  }
  std::vector<uint16_t> Download(const DeviceBuffer& b) {
    std::vector<uint16_t> out(b.size_bytes() / 2);
    EXPECT_TRUE(rt_.CopyAsync(out.data(), b.data(), b.size_bytes(), stream_).ok());
    EXPECT_TRUE(rt_.Synchronize(stream_).ok());
    return out;
  }
  Stream& stream() { return stream_; }

 private:
  Runtime& rt_;
  Stream stream_;
};

std::vector<uint16_t> EncodeAll(ScalarType t, const std::vector<double>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = Encode(t, v[i]);
  return out;
}

// Tolerance of one fp16/bf16 rounding of |x| plus fp32 accumulation slack.
double Tolerance(ScalarType t, double x) {
  return (t == ScalarType::kFloat16 ? 2e-3 : 1.6e-2) * std::max(1.0, std::fabs(x)) + 1e-3;
}

TEST_P(ComputeBehaviourTest, MemsetSetsExactlyTheRange) {
  Fixture f(*runtime_);
  DeviceBuffer buf = f.Upload(std::vector<uint16_t>(512, 0x1234));
  KVTIER_ASSERT_GPU_OK(
      runtime_->LaunchMemset(static_cast<char*>(buf.data()) + 3, 0xAB, 700, f.stream()));
  std::vector<uint8_t> bytes(1024);
  KVTIER_ASSERT_GPU_OK(runtime_->CopyAsync(bytes.data(), buf.data(), 1024, f.stream()));
  KVTIER_ASSERT_GPU_OK(runtime_->Synchronize(f.stream()));
  for (size_t i = 0; i < bytes.size(); ++i) {
    const uint8_t want = i >= 3 && i < 703 ? 0xAB : (i % 2 == 0 ? 0x34 : 0x12);
    ASSERT_EQ(bytes[i], want) << "byte " << i;
  }
  EXPECT_EQ(runtime_->LaunchMemset(nullptr, 0, 8, f.stream()).code(), GpuCode::kInvalidArgument);
  EXPECT_TRUE(runtime_->LaunchMemset(nullptr, 0, 0, f.stream()).ok());
}

TEST_P(ComputeBehaviourTest, GemmMatchesAReferenceWithPaddedLeadingDimensions) {
  for (ScalarType t : {ScalarType::kFloat16, ScalarType::kBFloat16}) {
    SCOPED_TRACE(std::string(ScalarTypeName(t)));
    Fixture f(*runtime_);
    const int64_t m = 37, n = 53, k = 72, lda = 80, ldb = 75, ldc = 60;
    const std::vector<double> a = Values(m * lda, 64, 1), b = Values(n * ldb, 64, 2);
    DeviceBuffer da = f.Upload(EncodeAll(t, a)), db = f.Upload(EncodeAll(t, b));
    DeviceBuffer dc = f.Upload(std::vector<uint16_t>(m * ldc, 0xBEEF));
    GemmArgs g;
    g.type = t;
    g.m = m, g.n = n, g.k = k;
    g.a = da.data(), g.lda = lda, g.b = db.data(), g.ldb = ldb, g.c = dc.data(), g.ldc = ldc;
    KVTIER_ASSERT_GPU_OK(compute_->LaunchGemm(g, f.stream()));
    const std::vector<uint16_t> c = f.Download(dc);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < ldc; ++j) {
        if (j >= n) {
          ASSERT_EQ(c[i * ldc + j], 0xBEEF) << "padding written at " << i << "," << j;
          continue;
        }
        double want = 0;
        for (int64_t x = 0; x < k; ++x) want += a[i * lda + x] * b[j * ldb + x];
        ASSERT_NEAR(Decode(t, c[i * ldc + j]), want, Tolerance(t, want)) << i << "," << j;
      }
    }
  }
}

TEST_P(ComputeBehaviourTest, GemmAccumulatesIntoCWhenAsked) {
  const ScalarType t = ScalarType::kFloat16;
  Fixture f(*runtime_);
  const int64_t m = 5, n = 7, k = 16;
  const std::vector<double> a = Values(m * k, 64, 7), b = Values(n * k, 64, 8),
                            c0 = Values(m * n, 128, 9);
  DeviceBuffer da = f.Upload(EncodeAll(t, a)), db = f.Upload(EncodeAll(t, b));
  DeviceBuffer dc = f.Upload(EncodeAll(t, c0));
  GemmArgs g;
  g.m = m, g.n = n, g.k = k;
  g.a = da.data(), g.b = db.data(), g.c = dc.data();
  g.accumulate = true;
  KVTIER_ASSERT_GPU_OK(compute_->LaunchGemm(g, f.stream()));
  const std::vector<uint16_t> c = f.Download(dc);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double want = c0[i * n + j];
      for (int64_t x = 0; x < k; ++x) want += a[i * k + x] * b[j * k + x];
      ASSERT_NEAR(Decode(t, c[i * n + j]), want, Tolerance(t, want)) << i << "," << j;
    }
  }
}

TEST_P(ComputeBehaviourTest, GemmRejectsBadArgumentsAndQueuesNothing) {
  Fixture f(*runtime_);
  DeviceBuffer d = f.Upload(std::vector<uint16_t>(64, 0));
  GemmArgs g;
  g.m = 4, g.n = 4, g.k = 4;
  g.a = g.b = d.data();
  g.c = d.data();
  GemmArgs bad = g;
  bad.k = 0;
  EXPECT_EQ(compute_->LaunchGemm(bad, f.stream()).code(), GpuCode::kInvalidArgument);
  bad = g;
  bad.lda = 3;
  EXPECT_EQ(compute_->LaunchGemm(bad, f.stream()).code(), GpuCode::kInvalidArgument);
  bad = g;
  bad.ldc = 2;
  EXPECT_EQ(compute_->LaunchGemm(bad, f.stream()).code(), GpuCode::kInvalidArgument);
  bad = g;
  bad.c = nullptr;
  EXPECT_EQ(compute_->LaunchGemm(bad, f.stream()).code(), GpuCode::kInvalidArgument);
  bad = g;
  bad.m = int64_t{1} << 31;
  EXPECT_EQ(compute_->LaunchGemm(bad, f.stream()).code(), GpuCode::kInvalidArgument);
  bad = g;
  bad.m = 0;
  EXPECT_TRUE(compute_->LaunchGemm(bad, f.stream()).ok());
  Stream empty;
  EXPECT_EQ(compute_->LaunchGemm(g, empty).code(), GpuCode::kInvalidArgument);
}

// A vLLM flash-attn cache of one layer, [2, kBlocks, kBlock, kHeads, kDim], and helpers.
constexpr int64_t kBlocks = 24, kBlock = 4, kHeads = 2, kDim = 16;
int64_t CacheIndex(int64_t plane, int64_t block, int64_t slot, int64_t h, int64_t d) {
  return (((plane * kBlocks + block) * kBlock + slot) * kHeads + h) * kDim + d;
}
constexpr int64_t kCacheElems = 2 * kBlocks * kBlock * kHeads * kDim;

KvLayout FlashAttnLayout() {
  KvLayout layout;
  EXPECT_TRUE(
      KvLayout::Create(KvLayoutSpec::VllmFlashAttn(kBlocks, kBlock, kHeads, kDim, 2), &layout)
          .ok());
  return layout;
}

std::vector<int32_t> ShuffledTable(uint32_t seed) {
  std::vector<int32_t> t(kBlocks);
  std::iota(t.begin(), t.end(), 0);
  std::shuffle(t.begin(), t.end(), std::mt19937(seed));
  return t;
}

TEST_P(ComputeBehaviourTest, KvAppendWritesEachTokenIntoItsBlockSlotAndNothingElse) {
  const ScalarType t = ScalarType::kFloat16;
  Fixture f(*runtime_);
  const KvLayout layout = FlashAttnLayout();
  const std::vector<int32_t> table = ShuffledTable(3);
  DeviceBuffer dtable = f.UploadInts(table);
  DeviceBuffer cache = f.Upload(std::vector<uint16_t>(kCacheElems, 0xCAFE));
  const int64_t first = 6, n = 9, stride = 3 * kHeads * kDim;  // K and V inside a QKV row
  const std::vector<double> qkv = Values(n * stride, 128, 4);
  DeviceBuffer dqkv = f.Upload(EncodeAll(t, qkv));
  KvAppendArgs a;
  a.type = t;
  a.kv.layout = &layout;
  a.kv.cache.tensors[0] = cache.data();
  a.kv.block_table = static_cast<const int32_t*>(dtable.data());
  a.first_position = first;
  a.num_tokens = n;
  a.k = static_cast<const uint16_t*>(dqkv.data()) + kHeads * kDim;
  a.k_token_stride = stride;
  a.v = static_cast<const uint16_t*>(dqkv.data()) + 2 * kHeads * kDim;
  a.v_token_stride = stride;
  KVTIER_ASSERT_GPU_OK(compute_->LaunchKvAppend(a, f.stream()));
  const std::vector<uint16_t> got = f.Download(cache);
  std::vector<uint16_t> want(kCacheElems, 0xCAFE);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t pos = first + i;
    for (int64_t p = 0; p < 2; ++p) {
      for (int64_t h = 0; h < kHeads; ++h) {
        for (int64_t d = 0; d < kDim; ++d) {
          want[CacheIndex(p, table[pos / kBlock], pos % kBlock, h, d)] =
              Encode(t, qkv[i * stride + (p + 1) * kHeads * kDim + h * kDim + d]);
        }
      }
    }
  }
  EXPECT_EQ(got, want);

  KvAppendArgs bad = a;
  bad.first_position = kBlocks * kBlock - 3;  // past the cache's blocks
  EXPECT_EQ(compute_->LaunchKvAppend(bad, f.stream()).code(), GpuCode::kInvalidArgument);
  bad = a;
  bad.k_token_stride = kHeads * kDim - 1;
  EXPECT_EQ(compute_->LaunchKvAppend(bad, f.stream()).code(), GpuCode::kInvalidArgument);
  KvLayout mla;
  ASSERT_TRUE(KvLayout::Create(KvLayoutSpec::Mla(kBlocks, kBlock, 64, 2), &mla).ok());
  bad = a;
  bad.kv.layout = &mla;
  EXPECT_EQ(compute_->LaunchKvAppend(bad, f.stream()).code(), GpuCode::kInvalidArgument);
}

// Attention of tokens [first, first + n) of a prompt whose K/V (all `context` tokens) sit in
// a shuffled flash-attn cache, against a double-precision reference over contiguous K/V.
void CheckAttention(Runtime& rt, ScalarType t, int64_t q_heads, int64_t first, int64_t n,
                    uint32_t seed) {
  SCOPED_TRACE("type " + std::string(ScalarTypeName(t)) + " q_heads " + std::to_string(q_heads) +
               " first " + std::to_string(first) + " n " + std::to_string(n));
  Fixture f(rt);
  const KvLayout layout = FlashAttnLayout();
  const std::vector<int32_t> table = ShuffledTable(seed);
  const int64_t context = first + n;
  const std::vector<double> kv = Values(2 * context * kHeads * kDim, 128, seed + 1);
  auto kv_at = [&](int64_t p, int64_t pos, int64_t h, int64_t d) {
    return kv[((p * context + pos) * kHeads + h) * kDim + d];
  };
  std::vector<uint16_t> cache_bits(kCacheElems, 0);
  for (int64_t p = 0; p < 2; ++p)
    for (int64_t pos = 0; pos < context; ++pos)
      for (int64_t h = 0; h < kHeads; ++h)
        for (int64_t d = 0; d < kDim; ++d)
          cache_bits[CacheIndex(p, table[pos / kBlock], pos % kBlock, h, d)] =
              Encode(t, kv_at(p, pos, h, d));
  const int64_t q_stride = q_heads * kDim + 8, out_stride = q_heads * kDim + 4;
  const std::vector<double> q = Values(n * q_stride, 64, seed + 2);
  DeviceBuffer dcache = f.Upload(cache_bits), dtable = f.UploadInts(table);
  DeviceBuffer dq = f.Upload(EncodeAll(t, q));
  DeviceBuffer dout = f.Upload(std::vector<uint16_t>(n * out_stride, 0xBEEF));
  PagedAttentionArgs a;
  a.type = t;
  a.kv.layout = &layout;
  a.kv.cache.tensors[0] = dcache.data();
  a.kv.block_table = static_cast<const int32_t*>(dtable.data());
  a.first_position = first;
  a.num_tokens = n;
  a.num_q_heads = q_heads;
  a.q = dq.data();
  a.q_token_stride = q_stride;
  a.out = dout.data();
  a.out_token_stride = out_stride;
  DeviceBuffer ws;
  const size_t ws_bytes = PagedAttentionWorkspaceBytes(a);
  ASSERT_GT(ws_bytes, 0u);
  ASSERT_TRUE(rt.Allocate(ws_bytes, &ws).ok());
  a.workspace = ws.data();
  a.workspace_bytes = ws_bytes;
  Compute compute(rt);
  KVTIER_ASSERT_GPU_OK(compute.LaunchPagedAttention(a, f.stream()));
  const std::vector<uint16_t> out = f.Download(dout);
  const double scale = 1.0 / std::sqrt(static_cast<double>(kDim));
  const int64_t group = q_heads / kHeads;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t h = 0; h < q_heads; ++h) {
      const int64_t g = h / group, visible = first + i + 1;
      std::vector<double> w(visible);
      double max_s = -INFINITY, sum = 0;
      for (int64_t pos = 0; pos < visible; ++pos) {
        double s = 0;
        for (int64_t d = 0; d < kDim; ++d)
          s += q[i * q_stride + h * kDim + d] * kv_at(0, pos, g, d);
        w[pos] = s * scale;
        max_s = std::max(max_s, w[pos]);
      }
      for (double& x : w) sum += (x = std::exp(x - max_s));
      for (int64_t d = 0; d < kDim; ++d) {
        double want = 0;
        for (int64_t pos = 0; pos < visible; ++pos) want += w[pos] / sum * kv_at(1, pos, g, d);
        ASSERT_NEAR(Decode(t, out[i * out_stride + h * kDim + d]), want, 2 * Tolerance(t, want))
            << "token " << i << " head " << h << " dim " << d;
      }
      for (int64_t pad = q_heads * kDim; pad < out_stride; ++pad) {
        ASSERT_EQ(out[i * out_stride + pad], 0xBEEF) << "padding written, token " << i;
      }
    }
  }
}

TEST_P(ComputeBehaviourTest, PagedAttentionMatchesAReferenceForPrefillAndCachedPrefixes) {
  CheckAttention(*runtime_, ScalarType::kFloat16, 2, 0, 13, 10);   // prefill, MHA
  CheckAttention(*runtime_, ScalarType::kFloat16, 6, 20, 11, 20);  // cached prefix, GQA 3:1
  CheckAttention(*runtime_, ScalarType::kBFloat16, 4, 33, 1, 30);  // one decode-like token
}

TEST_P(ComputeBehaviourTest, PagedAttentionCoversQueriesBeyondOneTile) {
  // More query tokens than one cuBLAS tile (kAttentionQueryTileTokens): needs a bigger cache.
  const int64_t n = kAttentionQueryTileTokens + 9, block = 16, heads = 1, dim = 8;
  const int64_t blocks = (n + block - 1) / block;
  Fixture f(*runtime_);
  KvLayout layout;
  ASSERT_TRUE(
      KvLayout::Create(KvLayoutSpec::VllmFlashAttn(blocks, block, heads, dim, 2), &layout).ok());
  std::vector<int32_t> table(blocks);
  std::iota(table.rbegin(), table.rend(), 0);  // reversed
  // Every V row of position p is p / 1024 in every dim, every K zero: uniform attention, so
  // token i's output is the mean of 0 .. i over 1024 = i / 2048.
  std::vector<uint16_t> cache(2 * blocks * block * heads * dim, 0);
  for (int64_t pos = 0; pos < n; ++pos)
    for (int64_t d = 0; d < dim; ++d)
      cache[((blocks + table[pos / block]) * block + pos % block) * dim + d] =
          Encode(ScalarType::kFloat16, pos / 1024.0);
  DeviceBuffer dcache = f.Upload(cache), dtable = f.UploadInts(table);
  const std::vector<double> q = Values(n * 2 * dim, 64, 5);
  DeviceBuffer dq = f.Upload(EncodeAll(ScalarType::kFloat16, q));
  DeviceBuffer dout = f.Upload(std::vector<uint16_t>(n * 2 * dim, 0));
  PagedAttentionArgs a;
  a.kv.layout = &layout;
  a.kv.cache.tensors[0] = dcache.data();
  a.kv.block_table = static_cast<const int32_t*>(dtable.data());
  a.num_tokens = n;
  a.num_q_heads = 2;
  a.q = dq.data();
  a.out = dout.data();
  DeviceBuffer ws;
  a.workspace_bytes = PagedAttentionWorkspaceBytes(a);
  ASSERT_TRUE(runtime_->Allocate(a.workspace_bytes, &ws).ok());
  a.workspace = ws.data();
  KVTIER_ASSERT_GPU_OK(compute_->LaunchPagedAttention(a, f.stream()));
  const std::vector<uint16_t> out = f.Download(dout);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t e = 0; e < 2 * dim; ++e) {
      ASSERT_NEAR(Decode(ScalarType::kFloat16, out[i * 2 * dim + e]), i / 2048.0, 2e-3)
          << "token " << i;
    }
  }
}

TEST_P(ComputeBehaviourTest, PagedAttentionRejectsBadArguments) {
  Fixture f(*runtime_);
  const KvLayout layout = FlashAttnLayout();
  DeviceBuffer d = f.Upload(std::vector<uint16_t>(kCacheElems, 0));
  DeviceBuffer table = f.UploadInts(ShuffledTable(1));
  PagedAttentionArgs a;
  a.kv.layout = &layout;
  a.kv.cache.tensors[0] = d.data();
  a.kv.block_table = static_cast<const int32_t*>(table.data());
  a.num_tokens = 4;
  a.num_q_heads = 4;
  a.q = a.out = d.data();
  DeviceBuffer ws;
  a.workspace_bytes = PagedAttentionWorkspaceBytes(a);
  ASSERT_TRUE(runtime_->Allocate(a.workspace_bytes, &ws).ok());
  a.workspace = ws.data();
  PagedAttentionArgs bad = a;
  bad.workspace_bytes -= 1;
  EXPECT_EQ(compute_->LaunchPagedAttention(bad, f.stream()).code(), GpuCode::kInvalidArgument);
  bad = a;
  bad.num_q_heads = 3;  // not a multiple of 2 KV heads
  EXPECT_EQ(compute_->LaunchPagedAttention(bad, f.stream()).code(), GpuCode::kInvalidArgument);
  bad = a;
  bad.scale = -1;
  EXPECT_EQ(compute_->LaunchPagedAttention(bad, f.stream()).code(), GpuCode::kInvalidArgument);
  bad = a;
  bad.kv.block_table = nullptr;
  EXPECT_EQ(compute_->LaunchPagedAttention(bad, f.stream()).code(), GpuCode::kInvalidArgument);
  bad = a;
  bad.num_tokens = kBlocks * kBlock + 1;
  EXPECT_EQ(compute_->LaunchPagedAttention(bad, f.stream()).code(), GpuCode::kInvalidArgument);
  KVTIER_ASSERT_GPU_OK(compute_->LaunchPagedAttention(a, f.stream()));
  KVTIER_ASSERT_GPU_OK(runtime_->Synchronize(f.stream()));
}

}  // namespace
}  // namespace kvtier::gpu::testing
