// Unit tests of KV layouts, gather/scatter and the layerwise pipelines on the host backend
// (no GPU needed), plus what only the host backend can show: injected copy failures
// reported with the right chunk and block ids.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "kv_transfer_behaviour_test.h"
#include "kvtier/gpu/kv_layout.h"
#include "kvtier/gpu/layerwise_load.h"
#include "kvtier/gpu/layerwise_store.h"
#include "layerwise_rig.h"
#include "runtime_test_support.h"

namespace kvtier::gpu::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(Host, KvTransferTest, KvTransferParams(Backend::kHost),
                         KvTransferTestName);
INSTANTIATE_TEST_SUITE_P(Host, LayerwiseTest, LayerwiseParams(Backend::kHost), LayerwiseTestName);

TEST(KvLayout, PresetsDeriveShapesStridesAndSpans) {
  KvLayout layout;
  ASSERT_TRUE(KvLayout::Create(KvLayoutSpec::VllmFlashAttn(10, 16, 8, 128, 2), &layout).ok());
  EXPECT_EQ(layout.shape(), (std::vector<int64_t>{2, 10, 16, 8, 128}));
  EXPECT_EQ(layout.strides(),
            (std::vector<int64_t>{10 * 16 * 8 * 128, 16 * 8 * 128, 8 * 128, 128, 1}));
  EXPECT_EQ(layout.num_planes(), 2);
  EXPECT_EQ(layout.tensor_span_bytes(0), size_t{2} * 10 * 16 * 8 * 128 * 2);
  EXPECT_EQ(layout.LayerPayloadBytes(256), size_t{2} * 256 * 8 * 128 * 2);

  ASSERT_TRUE(KvLayout::Create(KvLayoutSpec::VllmFlashInfer(10, 16, 8, 128, 1), &layout).ok());
  EXPECT_EQ(layout.shape(), (std::vector<int64_t>{10, 2, 16, 8, 128}));

  ASSERT_TRUE(KvLayout::Create(KvLayoutSpec::SglangMha(10, 1, 8, 128, 2), &layout).ok());
  EXPECT_EQ(layout.shape(), (std::vector<int64_t>{10, 8, 128}));
  EXPECT_EQ(layout.num_tensors(), 2);

  ASSERT_TRUE(KvLayout::Create(KvLayoutSpec::Mla(10, 64, 576, 2), &layout).ok());
  EXPECT_EQ(layout.shape(), (std::vector<int64_t>{10, 64, 576}));
  EXPECT_EQ(layout.num_planes(), 1);
  EXPECT_EQ(layout.heads(), 1);
  EXPECT_EQ(layout.head_dim(), 576);
  EXPECT_EQ(layout.LayerPayloadBytes(256), size_t{256} * 576 * 2);
}

TEST(KvLayout, PaddedStridesWidenTheTensorSpan) {
  KvLayoutSpec spec = KvLayoutSpec::Mla(4, 2, 3, 4);
  spec.strides = {2 * 8 + 1, 8, 1};  // Rows of 8 elements, one spare element per block.
  KvLayout layout;
  ASSERT_TRUE(KvLayout::Create(spec, &layout).ok());
  EXPECT_EQ(layout.tensor_span_bytes(0), size_t{(3 * 17 + 8 + 2 + 1) * 4});
}

TEST(KvLayout, RejectsBadSpecsNamingTheField) {
  KvLayout layout;
  auto rejects = [&](KvLayoutSpec spec, const char* needle) {
    const GpuStatus s = KvLayout::Create(spec, &layout);
    EXPECT_EQ(s.code(), GpuCode::kInvalidArgument);
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  rejects(KvLayoutSpec::VllmFlashAttn(10, 16, 8, 128, 3), "elem_bytes");
  rejects(KvLayoutSpec::VllmFlashAttn(0, 16, 8, 128, 2), "num_blocks");
  rejects(KvLayoutSpec::VllmFlashAttn(int64_t{1} << 31, 16, 8, 128, 2), "num_blocks");
  rejects(KvLayoutSpec::VllmFlashAttn(10, 0, 8, 128, 2), "block_size_tokens");
  rejects(KvLayoutSpec::VllmFlashAttn(10, 16, 0, 128, 2), "num_kv_heads");
  rejects(KvLayoutSpec::SglangMha(10, 1, 8, 0, 2), "head_dim");
  KvLayoutSpec mla = KvLayoutSpec::Mla(10, 16, 576, 2);
  mla.num_kv_heads = 1;
  rejects(mla, "MLA");
  KvLayoutSpec rank = KvLayoutSpec::VllmFlashAttn(10, 16, 8, 128, 2);
  rank.strides = {1, 2, 3};
  rejects(rank, "strides must have 5");
  KvLayoutSpec alias = KvLayoutSpec::VllmFlashAttn(10, 16, 8, 128, 2);
  alias.strides = {10 * 16 * 8 * 128, 16 * 8 * 128, 8 * 128, 64, 1};  // Heads overlap.
  rejects(alias, "alias");
  KvLayoutSpec negative = KvLayoutSpec::SglangMha(10, 1, 8, 128, 2);
  negative.strides = {-1024, 128, 1};
  rejects(negative, "negative");
}

TEST(Runtime, LaunchKvCopyRejectsBadArgumentsAndQueuesNothing) {
  std::unique_ptr<Runtime> runtime = Runtime::CreateHost();
  Stream stream;
  KVTIER_ASSERT_GPU_OK(runtime->CreateStream(&stream));
  KvLayout layout;
  ASSERT_TRUE(KvLayout::Create(KvLayoutSpec::VllmFlashAttn(4, 4, 1, 8, 2), &layout).ok());
  std::vector<uint8_t> tensor(layout.tensor_span_bytes(0), 7);
  const std::vector<uint8_t> before = tensor;
  std::vector<uint8_t> payload(layout.LayerPayloadBytes(8), 1);
  const std::vector<uint64_t> addrs = {reinterpret_cast<uint64_t>(payload.data())};
  const std::vector<int32_t> ids = {0, 1};
  KvLayerCopy good;
  good.layout = &layout;
  good.cache.tensors[0] = tensor.data();
  good.chunk_tokens = 8;
  good.num_chunks = 1;
  good.chunk_addrs = addrs.data();
  good.block_ids = ids.data();
  auto code = [&](KvLayerCopy copy) { return runtime->LaunchKvCopy(copy, stream).code(); };
  KvLayerCopy bad = good;
  bad.layout = nullptr;
  EXPECT_EQ(code(bad), GpuCode::kInvalidArgument);
  bad = good;
  bad.chunk_tokens = 6;
  EXPECT_EQ(code(bad), GpuCode::kInvalidArgument) << "not a multiple of the block size";
  bad = good;
  bad.block_ids = nullptr;
  EXPECT_EQ(code(bad), GpuCode::kInvalidArgument);
  bad = good;
  bad.cache.tensors[0] = nullptr;
  EXPECT_EQ(code(bad), GpuCode::kInvalidArgument);
  bad = good;
  bad.payload_align_bytes = 12;
  EXPECT_EQ(code(bad), GpuCode::kInvalidArgument);
  Stream empty;
  EXPECT_EQ(runtime->LaunchKvCopy(good, empty).code(), GpuCode::kInvalidArgument);
  KVTIER_ASSERT_GPU_OK(runtime->Synchronize(stream));
  EXPECT_EQ(tensor, before);

  KVTIER_ASSERT_GPU_OK(runtime->LaunchKvCopy(good, stream));  // Scatter: blocks 0 and 1.
  KVTIER_ASSERT_GPU_OK(runtime->Synchronize(stream));
  EXPECT_NE(tensor, before);
}

TEST(KvTransfer, RejectsChunkSetsThatDoNotFit) {
  std::unique_ptr<Runtime> runtime = Runtime::CreateHost();
  Stream stream;
  KVTIER_ASSERT_GPU_OK(runtime->CreateStream(&stream));
  LayerwiseRig rig;
  ASSERT_NO_FATAL_FAILURE(rig.Init(*runtime, stream));
  std::unique_ptr<KvTransfer> transfer;
  auto code = [&](KvChunkSet chunks) {
    return KvTransfer::Create(*runtime, std::move(chunks), KvTransferOptions(), stream, &transfer)
        .code();
  };
  KvChunkSet bad = rig.Chunks();
  bad.block_ids[5] = static_cast<int32_t>(rig.layout.num_blocks());
  EXPECT_EQ(code(bad), GpuCode::kInvalidArgument) << "block id out of range";
  bad = rig.Chunks();
  bad.block_ids.pop_back();
  EXPECT_EQ(code(bad), GpuCode::kInvalidArgument) << "short block ids";
  bad = rig.Chunks();
  bad.payloads[2] = static_cast<uint8_t*>(bad.payloads[2]) + 1;  // Runs past the arena.
  EXPECT_EQ(code(bad), GpuCode::kInvalidArgument) << "payload outside the arena";
  bad = rig.Chunks();
  bad.chunk_tokens = 6;
  EXPECT_EQ(code(bad), GpuCode::kInvalidArgument) << "chunk not a multiple of the block";
  EXPECT_EQ(transfer, nullptr);

  std::unique_ptr<LayerwiseLoad> load;
  KvChunkSet twice = rig.Chunks();
  twice.block_ids[7] = twice.block_ids[0];
  EXPECT_EQ(
      LayerwiseLoad::Create(*runtime, twice, rig.layers, KvTransferOptions(), stream, &load).code(),
      GpuCode::kInvalidArgument)
      << "two tokens loading into one block";
  std::vector<LayerTensors> short_layers(rig.layers.begin(), rig.layers.end() - 1);
  EXPECT_EQ(LayerwiseLoad::Create(*runtime, rig.Chunks(), short_layers, KvTransferOptions(), stream,
                                  &load)
                .code(),
            GpuCode::kInvalidArgument);
}

TEST(KvTransfer, PayloadsMustLieInTheArenaOrTheDevicePool) {
  std::unique_ptr<Runtime> runtime = Runtime::CreateHost();
  std::unique_ptr<Runtime> other = Runtime::CreateHost();
  Stream stream;
  KVTIER_ASSERT_GPU_OK(runtime->CreateStream(&stream));
  LayerwiseRig rig;
  ASSERT_NO_FATAL_FAILURE(rig.Init(*runtime, stream));
  DeviceBuffer pool, foreign_pool;
  KVTIER_ASSERT_GPU_OK(runtime->Allocate(LayerwiseRig::kChunks * rig.payload_bytes, &pool));
  KVTIER_ASSERT_GPU_OK(other->Allocate(LayerwiseRig::kChunks * rig.payload_bytes, &foreign_pool));
  std::unique_ptr<KvTransfer> transfer;
  auto rejects = [&](KvChunkSet chunks, const char* needle) {
    const GpuStatus s =
        KvTransfer::Create(*runtime, std::move(chunks), KvTransferOptions(), stream, &transfer);
    EXPECT_EQ(s.code(), GpuCode::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  KvChunkSet bad = rig.Chunks();
  bad.arena = nullptr;
  rejects(bad, "neither an arena nor a device_pool");
  bad.device_pool = &pool;  // The payloads are still in the (now absent) arena.
  rejects(bad, "payload of chunk 0");
  bad = rig.Chunks();
  bad.device_pool = &foreign_pool;
  rejects(bad, "another runtime");
  const DeviceBuffer empty;
  bad.device_pool = &empty;
  rejects(bad, "device_pool is empty");
  bad = rig.Chunks();
  bad.device_pool = &pool;
  // Runs past the end of the pool.
  bad.payloads[2] = static_cast<uint8_t*>(pool.data()) + 2 * rig.payload_bytes + 1;
  rejects(bad, "payload of chunk 2");
  EXPECT_EQ(transfer, nullptr);

  // Payloads in the pool only, or some in each: accepted on both paths.
  for (CopyPath path : {CopyPath::kDma, CopyPath::kZeroCopy}) {
    KvTransferOptions options;
    options.path = path;
    KvChunkSet in_pool = rig.Chunks();
    in_pool.device_pool = &pool;
    in_pool.payloads[1] = static_cast<uint8_t*>(pool.data()) + rig.payload_bytes;
    KVTIER_ASSERT_GPU_OK(KvTransfer::Create(*runtime, in_pool, options, stream, &transfer));
    KVTIER_ASSERT_GPU_OK(runtime->Synchronize(stream));  // Its uploads, before it is replaced.
    in_pool.arena = nullptr;
    for (int64_t c = 0; c < LayerwiseRig::kChunks; ++c) {
      in_pool.payloads[c] = static_cast<uint8_t*>(pool.data()) + c * rig.payload_bytes;
    }
    KVTIER_ASSERT_GPU_OK(KvTransfer::Create(*runtime, in_pool, options, stream, &transfer));
    KVTIER_ASSERT_GPU_OK(runtime->Synchronize(stream));
  }
}

class FaultTest : public ::testing::TestWithParam<CopyPath> {};

INSTANTIATE_TEST_SUITE_P(Host, FaultTest, ::testing::Values(CopyPath::kDma, CopyPath::kZeroCopy),
                         [](const auto& info) { return std::string(CopyPathName(info.param)); });

TEST_P(FaultTest, LoadReportsTheFailedChunkAndItsBlocksAndLoadsTheOthers) {
  constexpr int64_t kBadChunk = 1, kBadLayer = 2;
  // The rig's arena is allocated in Init; bind the fault to it through a shared cell.
  auto bad_range = std::make_shared<std::pair<const uint8_t*, const uint8_t*>>();
  HostRuntimeOptions options;
  options.inject_fault = [bad_range](const void* ptr, size_t bytes) {
    const auto* p = static_cast<const uint8_t*>(ptr);
    return p < bad_range->second && p + bytes > bad_range->first;
  };
  std::unique_ptr<Runtime> runtime = Runtime::CreateHost(std::move(options));
  Stream load_stream;
  KVTIER_ASSERT_GPU_OK(runtime->CreateStream(&load_stream));
  LayerwiseRig rig;
  ASSERT_NO_FATAL_FAILURE(rig.Init(*runtime, load_stream));
  *bad_range = {rig.Slice(kBadChunk, kBadLayer), rig.Slice(kBadChunk, kBadLayer) + rig.layer_bytes};

  KvTransferOptions transfer_options;
  transfer_options.path = GetParam();
  std::unique_ptr<LayerwiseLoad> load;
  KVTIER_ASSERT_GPU_OK(LayerwiseLoad::Create(*runtime, rig.Chunks(), rig.layers, transfer_options,
                                             load_stream, &load));
  KVTIER_ASSERT_GPU_OK(load->Start());
  KvCopyReport report;
  KVTIER_ASSERT_GPU_OK(load->Finish(&report));

  ASSERT_EQ(report.failed_chunks.size(), 1u);
  const ChunkCopyFailure& failure = report.failed_chunks[0];
  EXPECT_EQ(failure.chunk_index, kBadChunk);
  // DMA copies layer by layer and fails at the bad layer; zero-copy maps the whole payload
  // up front and fails before any layer.
  EXPECT_EQ(failure.layer, GetParam() == CopyPath::kDma ? kBadLayer : 0);
  EXPECT_EQ(failure.status.code(), GpuCode::kDeviceError);
  const std::vector<int32_t> bad_ids(
      rig.block_ids.begin() + kBadChunk * LayerwiseRig::kBlocksPerChunk,
      rig.block_ids.begin() + (kBadChunk + 1) * LayerwiseRig::kBlocksPerChunk);
  EXPECT_EQ(failure.block_ids, bad_ids);
  std::vector<int32_t> sorted_ids = bad_ids;
  std::sort(sorted_ids.begin(), sorted_ids.end());
  EXPECT_EQ(report.FailedBlockIds(), sorted_ids);

  // The other chunks loaded in every layer; the failed chunk only before its failure, and
  // its blocks were not written from the bad layer on.
  const std::vector<uint8_t> zeros(rig.span, 0);
  for (int64_t l = 0; l < LayerwiseRig::kLayers; ++l) {
    std::vector<uint8_t> tensor;
    ASSERT_NO_FATAL_FAILURE(rig.ReadTensor(*runtime, load_stream, rig.tensors[l].data(), &tensor));
    const bool bad_loaded = l < failure.layer;
    EXPECT_EQ(tensor,
              rig.ExpectedTensor(l, zeros, [&](int64_t c) { return c != kBadChunk || bad_loaded; }))
        << "layer " << l;
  }
}

TEST_P(FaultTest, StoreReportsTheChunkWhosePayloadIsIncomplete) {
  constexpr int64_t kBadChunk = 2, kBadLayer = 1;
  auto bad_range = std::make_shared<std::pair<const uint8_t*, const uint8_t*>>();
  HostRuntimeOptions options;
  options.inject_fault = [bad_range](const void* ptr, size_t bytes) {
    const auto* p = static_cast<const uint8_t*>(ptr);
    return p < bad_range->second && p + bytes > bad_range->first;
  };
  std::unique_ptr<Runtime> runtime = Runtime::CreateHost(std::move(options));
  Stream store_stream, compute;
  KVTIER_ASSERT_GPU_OK(runtime->CreateStream(&store_stream));
  KVTIER_ASSERT_GPU_OK(runtime->CreateStream(&compute));
  LayerwiseRig rig;
  ASSERT_NO_FATAL_FAILURE(rig.Init(*runtime, store_stream));
  *bad_range = {rig.Slice(kBadChunk, kBadLayer), rig.Slice(kBadChunk, kBadLayer) + rig.layer_bytes};
  std::vector<std::vector<uint8_t>> cache(LayerwiseRig::kLayers);
  for (int64_t l = 0; l < LayerwiseRig::kLayers; ++l) {
    KVTIER_ASSERT_GPU_OK(runtime->LaunchFill(rig.tensors[l].data(), rig.span, 70 + l, compute));
  }
  KVTIER_ASSERT_GPU_OK(runtime->Synchronize(compute));
  for (int64_t l = 0; l < LayerwiseRig::kLayers; ++l) {
    ASSERT_NO_FATAL_FAILURE(rig.ReadTensor(*runtime, compute, rig.tensors[l].data(), &cache[l]));
  }

  KvTransferOptions transfer_options;
  transfer_options.path = GetParam();
  std::unique_ptr<LayerwiseStore> store;
  KVTIER_ASSERT_GPU_OK(LayerwiseStore::Create(*runtime, rig.Chunks(), rig.layers, transfer_options,
                                              store_stream, &store));
  for (int64_t l = 0; l < LayerwiseRig::kLayers; ++l) {
    KVTIER_ASSERT_GPU_OK(store->LayerWritten(l, compute));
  }
  KvCopyReport report;
  KVTIER_ASSERT_GPU_OK(store->Finish(&report));
  ASSERT_EQ(report.failed_chunks.size(), 1u);
  EXPECT_EQ(report.failed_chunks[0].chunk_index, kBadChunk);
  EXPECT_EQ(report.failed_chunks[0].layer, GetParam() == CopyPath::kDma ? kBadLayer : 0);
  for (int64_t c = 0; c < LayerwiseRig::kChunks; ++c) {
    if (c == kBadChunk) continue;
    for (int64_t l = 0; l < LayerwiseRig::kLayers; ++l) {
      const uint8_t* slice = rig.Slice(c, l);
      EXPECT_EQ(std::vector<uint8_t>(slice, slice + rig.layer_bytes),
                rig.ExpectedSlice(c, cache[l]))
          << "chunk " << c << " layer " << l;
    }
  }
}

TEST(KvTransfer, ASkippedBlockIsLeftUntouchedByALoadAndRefusedByAStore) {
  std::unique_ptr<Runtime> runtime = Runtime::CreateHost();
  Stream stream;
  KVTIER_ASSERT_GPU_OK(runtime->CreateStream(&stream));
  LayerwiseRig rig;
  ASSERT_NO_FATAL_FAILURE(rig.Init(*runtime, stream));
  // The engine holds the first two blocks of chunk 0 itself: a load must not write them.
  KvChunkSet chunks = rig.Chunks();
  const int32_t skipped[2] = {chunks.block_ids[0], chunks.block_ids[1]};
  chunks.block_ids[0] = chunks.block_ids[1] = kSkipBlock;
  std::unique_ptr<KvTransfer> transfer;
  KVTIER_ASSERT_GPU_OK(
      KvTransfer::Create(*runtime, chunks, KvTransferOptions(), stream, &transfer));
  for (int64_t l = 0; l < LayerwiseRig::kLayers; ++l) {
    KVTIER_ASSERT_GPU_OK(transfer->QueueLayer(l, KvCopyDirection::kPayloadToCache, rig.layers[l]));
  }
  KVTIER_ASSERT_GPU_OK(runtime->Synchronize(stream));
  EXPECT_TRUE(transfer->Report().failed_chunks.empty());
  const int64_t block_elems =
      rig.spec.block_size_tokens * rig.spec.num_kv_heads * rig.spec.head_dim;
  for (int64_t l = 0; l < LayerwiseRig::kLayers; ++l) {
    std::vector<uint8_t> want =
        rig.ExpectedTensor(l, std::vector<uint8_t>(rig.span, 0), [](int64_t) { return true; });
    for (int32_t b : skipped) {  // [2, num_blocks, block, heads, dim]: K and V of block b
      for (int64_t plane = 0; plane < 2; ++plane) {
        const int64_t elem = (plane * rig.spec.num_blocks + b) * block_elems;
        std::memset(&want[elem * rig.spec.elem_bytes], 0, block_elems * rig.spec.elem_bytes);
      }
    }
    std::vector<uint8_t> got(rig.span);
    std::memcpy(got.data(), rig.tensors[l].data(), rig.span);
    EXPECT_EQ(got, want) << "layer " << l;
  }
  std::unique_ptr<LayerwiseStore> store;
  EXPECT_EQ(
      LayerwiseStore::Create(*runtime, chunks, rig.layers, KvTransferOptions(), stream, &store)
          .code(),
      GpuCode::kInvalidArgument);
  chunks.block_ids[0] = -2;
  EXPECT_EQ(KvTransfer::Create(*runtime, chunks, KvTransferOptions(), stream, &transfer).code(),
            GpuCode::kInvalidArgument);
}

TEST(LayerwiseStore, ALayerNeverWrittenFailsEveryChunk) {
  std::unique_ptr<Runtime> runtime = Runtime::CreateHost();
  Stream store_stream, compute;
  KVTIER_ASSERT_GPU_OK(runtime->CreateStream(&store_stream));
  KVTIER_ASSERT_GPU_OK(runtime->CreateStream(&compute));
  LayerwiseRig rig;
  ASSERT_NO_FATAL_FAILURE(rig.Init(*runtime, store_stream));
  std::unique_ptr<LayerwiseStore> store;
  KVTIER_ASSERT_GPU_OK(LayerwiseStore::Create(*runtime, rig.Chunks(), rig.layers,
                                              KvTransferOptions(), store_stream, &store));
  KVTIER_ASSERT_GPU_OK(store->LayerWritten(0, compute));
  KVTIER_ASSERT_GPU_OK(store->LayerWritten(2, compute));
  KvCopyReport report;
  EXPECT_EQ(store->Finish(&report).code(), GpuCode::kInvalidArgument);
  ASSERT_EQ(report.failed_chunks.size(), static_cast<size_t>(LayerwiseRig::kChunks));
  for (const ChunkCopyFailure& f : report.failed_chunks) EXPECT_EQ(f.layer, 1);
}

}  // namespace
}  // namespace kvtier::gpu::testing
