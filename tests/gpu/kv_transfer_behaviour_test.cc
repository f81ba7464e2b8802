// Gather/scatter behaviour every backend must show, for every layout case x element size x
// block size, on both copy paths. Instantiated per backend by kv_transfer_test.cc (host)
// and kv_transfer_cuda_test.cc (CUDA, skipping without a GPU).

#include "kv_transfer_behaviour_test.h"

#include <cstring>
#include <memory>
#include <vector>

#include "kvtier/gpu/kv_transfer.h"
#include "runtime_test_support.h"

namespace kvtier::gpu::testing {
namespace {

constexpr int64_t kChunkTokens = 16;
constexpr int64_t kNumChunks = 3;
constexpr int64_t kNumLayers = 2;
constexpr size_t kPayloadShift = 64;  // Payloads start 64 B into the arena (not page-aligned).

// Device tensors of every layer, and their host mirror.
struct Cache {
  std::vector<DeviceBuffer> buffers;  // [layer * tensors + t]
  std::vector<std::vector<uint8_t>> host;
  std::vector<LayerTensors> layers;
};

}  // namespace

void KvTransferTest::SetUp() {
  const auto [backend, kv_case, elem, bs] = GetParam();
  GpuStatus s;
  runtime_ = MakeRuntime(backend, &s);
  if (!s.ok()) GTEST_SKIP() << "no usable GPU: " << s.ToString();
  spec_ = MakeSpec(kv_case, kNumChunks * kChunkTokens / bs + 5, bs, elem);
  ASSERT_TRUE(KvLayout::Create(spec_, &layout_).ok());
}

TEST_P(KvTransferTest, GatherMatchesReferenceAndScatterRestoresTheCache) {
  const auto [backend, kv_case, elem, bs] = GetParam();
  const int64_t bpc = kChunkTokens / bs;
  const std::vector<int32_t> block_ids =
      ShuffledBlockIds(layout_.num_blocks(), kNumChunks * bpc, 7 + static_cast<uint32_t>(bs));
  const size_t layer_bytes = layout_.LayerPayloadBytes(kChunkTokens);
  const size_t payload_bytes = layer_bytes * kNumLayers;
  ASSERT_EQ(layer_bytes,
            static_cast<size_t>(NumPlanes(kv_case) * kChunkTokens * RowElems(kv_case) * elem));

  Stream stream;
  KVTIER_ASSERT_GPU_OK(runtime_->CreateStream(&stream));
  const int nt = layout_.num_tensors();
  ASSERT_EQ(nt, NumTensors(kv_case));

  // Fills every layer tensor with a distinct pattern and mirrors it on the host.
  auto fill_cache = [&](Cache* cache, uint64_t seed) {
    for (int64_t l = 0; l < kNumLayers; ++l) {
      for (int t = 0; t < nt; ++t) {
        const size_t span = layout_.tensor_span_bytes(t);
        const size_t i = static_cast<size_t>(l * nt + t);
        KVTIER_ASSERT_GPU_OK(
            runtime_->LaunchFill(cache->buffers[i].data(), span, seed + i, stream));
        cache->host[i].assign(span, 0);
        KVTIER_ASSERT_GPU_OK(
            runtime_->CopyAsync(cache->host[i].data(), cache->buffers[i].data(), span, stream));
      }
    }
    KVTIER_ASSERT_GPU_OK(runtime_->Synchronize(stream));
  };
  Cache cache;
  cache.buffers.resize(kNumLayers * nt);
  cache.host.resize(kNumLayers * nt);
  cache.layers.resize(kNumLayers);
  for (int64_t l = 0; l < kNumLayers; ++l) {
    for (int t = 0; t < nt; ++t) {
      DeviceBuffer& b = cache.buffers[l * nt + t];
      KVTIER_ASSERT_GPU_OK(runtime_->Allocate(layout_.tensor_span_bytes(t), &b));
      cache.layers[l].tensors[t] = b.data();
    }
  }

  HostMemory arena(kPayloadShift + kNumChunks * payload_bytes);
  PinnedRange pinned;
  KVTIER_ASSERT_GPU_OK(runtime_->RegisterHost(arena.data(), arena.size(), PinOptions(), &pinned));
  std::vector<void*> payloads;
  for (int64_t c = 0; c < kNumChunks; ++c) {
    payloads.push_back(arena.data() + kPayloadShift + c * payload_bytes);
  }

  for (CopyPath path : {CopyPath::kDma, CopyPath::kZeroCopy}) {
    SCOPED_TRACE(std::string(CopyPathName(path)));
    KvTransferOptions options;
    options.path = path;
    options.max_staging_bytes = 2 * layer_bytes;  // Two staging batches for three chunks.
    fill_cache(&cache, 1000);
    std::memset(arena.data(), 0xA5, arena.size());

    // Gather: every payload byte equals the reference element.
    std::unique_ptr<KvTransfer> gather;
    KVTIER_ASSERT_GPU_OK(KvTransfer::Create(
        *runtime_, KvChunkSet{&layout_, kNumLayers, kChunkTokens, &pinned, payloads, block_ids},
        options, stream, &gather));
    for (int64_t l = 0; l < kNumLayers; ++l) {
      KVTIER_ASSERT_GPU_OK(
          gather->QueueLayer(l, KvCopyDirection::kCacheToPayload, cache.layers[l]));
    }
    KVTIER_ASSERT_GPU_OK(runtime_->Synchronize(stream));
    EXPECT_TRUE(gather->Report().failed_chunks.empty());
    std::vector<uint8_t> expected_arena(arena.size(), 0xA5);
    for (int64_t c = 0; c < kNumChunks; ++c) {
      for (int64_t l = 0; l < kNumLayers; ++l) {
        uint8_t* slice =
            expected_arena.data() + kPayloadShift + c * payload_bytes + l * layer_bytes;
        ForEachElement(spec_, kChunkTokens, &block_ids[c * bpc],
                       [&](int64_t pay, int tensor, int64_t off, uint32_t e) {
                         std::memcpy(slice + pay, &cache.host[l * nt + tensor][off], e);
                       });
      }
    }
    ASSERT_EQ(std::vector<uint8_t>(arena.data(), arena.data() + arena.size()), expected_arena)
        << "gather differs from the CPU reference";

    // Scatter back into a cache holding other bytes: the chunks' elements come back
    // bit-exact, every other byte is untouched.
    const std::vector<std::vector<uint8_t>> gathered_from = cache.host;
    fill_cache(&cache, 5000);
    std::vector<std::vector<uint8_t>> expected_cache = cache.host;
    for (int64_t c = 0; c < kNumChunks; ++c) {
      for (int64_t l = 0; l < kNumLayers; ++l) {
        ForEachElement(spec_, kChunkTokens, &block_ids[c * bpc],
                       [&](int64_t, int tensor, int64_t off, uint32_t e) {
                         std::memcpy(&expected_cache[l * nt + tensor][off],
                                     &gathered_from[l * nt + tensor][off], e);
                       });
      }
    }
    std::unique_ptr<KvTransfer> scatter;
    KVTIER_ASSERT_GPU_OK(KvTransfer::Create(
        *runtime_, KvChunkSet{&layout_, kNumLayers, kChunkTokens, &pinned, payloads, block_ids},
        options, stream, &scatter));
    for (int64_t l = 0; l < kNumLayers; ++l) {
      KVTIER_ASSERT_GPU_OK(
          scatter->QueueLayer(l, KvCopyDirection::kPayloadToCache, cache.layers[l]));
    }
    for (size_t i = 0; i < cache.buffers.size(); ++i) {
      KVTIER_ASSERT_GPU_OK(runtime_->CopyAsync(cache.host[i].data(), cache.buffers[i].data(),
                                               cache.host[i].size(), stream));
    }
    KVTIER_ASSERT_GPU_OK(runtime_->Synchronize(stream));
    EXPECT_TRUE(scatter->Report().failed_chunks.empty());
    for (size_t i = 0; i < cache.host.size(); ++i) {
      ASSERT_EQ(cache.host[i], expected_cache[i]) << "tensor " << i << " after scatter";
    }
  }
}

std::string KvTransferTestName(const ::testing::TestParamInfo<KvTransferParam>& info) {
  const auto [backend, kv_case, elem, bs] = info.param;
  return std::string(backend == Backend::kHost ? "host_" : "cuda_") + KvCaseName(kv_case) + "_e" +
         std::to_string(elem) + "_bs" + std::to_string(bs);
}

}  // namespace kvtier::gpu::testing
