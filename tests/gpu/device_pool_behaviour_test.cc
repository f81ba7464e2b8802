// Layerwise load and store of chunks whose payloads lie in device memory
// (KvChunkSet::device_pool), on both copy paths: every payload in the pool, or some in the
// pool and the rest in the host arena. Instantiated per backend with LayerwiseTest by
// kv_transfer_test.cc (host) and kv_transfer_cuda_test.cc (CUDA, skipping without a GPU).

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kv_transfer_behaviour_test.h"
#include "kvtier/gpu/layerwise_load.h"
#include "kvtier/gpu/layerwise_store.h"
#include "layerwise_rig.h"
#include "runtime_test_support.h"

namespace kvtier::gpu::testing {
namespace {

constexpr size_t kPoolShift = 64;  // Pool payloads start 64 B in (not 256-byte aligned).

// The daemon's HBM pool as a client maps it: exported memory opened by its handle on the
// host backend (a second mapping, as another process gets); on CUDA the exported buffer
// itself, since CUDA cannot open a handle in the process that exported it.
struct DevicePool {
  DeviceBuffer exported;
  DeviceBuffer opened;

  void Init(Runtime& runtime, size_t bytes) {
    std::string handle;
    KVTIER_ASSERT_GPU_OK(runtime.AllocateExported(bytes, &exported, &handle));
    if (runtime.backend() == Backend::kHost) {
      KVTIER_ASSERT_GPU_OK(runtime.OpenExported(handle, bytes, &opened));
    }
  }
  const DeviceBuffer& view() const { return opened.empty() ? exported : opened; }
  uint8_t* At(size_t offset) const { return static_cast<uint8_t*>(view().data()) + offset; }
};

enum class Placement { kAllInPool, kMixed };

bool InPool(Placement placement, int64_t chunk) {
  return placement == Placement::kAllInPool || chunk == 1;
}

// Moves the payloads of the chunks `placement` puts in the pool from the rig's arena into
// `pool` and points the rig at them; their arena bytes are then overwritten, so that a
// transfer reading the arena instead of the pool shows. Wrap in ASSERT_NO_FATAL_FAILURE.
void MovePayloadsToPool(Runtime& runtime, Stream& stream, Placement placement, DevicePool* pool,
                        LayerwiseRig* rig) {
  ASSERT_NO_FATAL_FAILURE(
      pool->Init(runtime, kPoolShift + LayerwiseRig::kChunks * rig->payload_bytes));
  for (int64_t c = 0; c < LayerwiseRig::kChunks; ++c) {
    if (!InPool(placement, c)) continue;
    uint8_t* slot = pool->At(kPoolShift + c * rig->payload_bytes);
    KVTIER_ASSERT_GPU_OK(runtime.CopyAsync(slot, rig->payloads[c], rig->payload_bytes, stream));
    KVTIER_ASSERT_GPU_OK(runtime.Synchronize(stream));
    std::memset(rig->payloads[c], 0xEE, rig->payload_bytes);
    rig->payloads[c] = slot;
  }
}

KvChunkSet PoolChunks(const LayerwiseRig& rig, const DevicePool& pool, Placement placement) {
  KvChunkSet chunks = rig.Chunks();
  chunks.device_pool = &pool.view();
  if (placement == Placement::kAllInPool) chunks.arena = nullptr;  // Not needed then.
  return chunks;
}

const char* PlacementName(Placement placement) {
  return placement == Placement::kAllInPool ? "all payloads in the pool"
                                            : "chunk 1 in the pool, the others in the arena";
}

TEST_P(LayerwiseTest, LoadsPayloadsFromADevicePool) {
  KvTransferOptions options;
  options.path = std::get<1>(GetParam());
  for (Placement placement : {Placement::kAllInPool, Placement::kMixed}) {
    SCOPED_TRACE(PlacementName(placement));
    Stream load_stream;
    KVTIER_ASSERT_GPU_OK(runtime_->CreateStream(&load_stream));
    LayerwiseRig rig;
    ASSERT_NO_FATAL_FAILURE(rig.Init(*runtime_, load_stream));
    // From the arena's bytes, before the pool chunks' arena copies are overwritten.
    const std::vector<uint8_t> zeros(rig.span, 0);
    std::vector<std::vector<uint8_t>> expected;
    for (int64_t l = 0; l < LayerwiseRig::kLayers; ++l) {
      expected.push_back(rig.ExpectedTensor(l, zeros, [](int64_t) { return true; }));
    }
    DevicePool pool;
    ASSERT_NO_FATAL_FAILURE(MovePayloadsToPool(*runtime_, load_stream, placement, &pool, &rig));

    std::unique_ptr<LayerwiseLoad> load;
    KVTIER_ASSERT_GPU_OK(LayerwiseLoad::Create(*runtime_, PoolChunks(rig, pool, placement),
                                               rig.layers, options, load_stream, &load));
    KVTIER_ASSERT_GPU_OK(load->Start());
    KvCopyReport report;
    KVTIER_ASSERT_GPU_OK(load->Finish(&report));
    EXPECT_TRUE(report.failed_chunks.empty());
    for (int64_t l = 0; l < LayerwiseRig::kLayers; ++l) {
      std::vector<uint8_t> tensor;
      ASSERT_NO_FATAL_FAILURE(
          rig.ReadTensor(*runtime_, load_stream, rig.tensors[l].data(), &tensor));
      EXPECT_EQ(tensor, expected[l]) << "layer " << l;
    }
  }
}

TEST_P(LayerwiseTest, StoresPayloadsIntoADevicePool) {
  KvTransferOptions options;
  options.path = std::get<1>(GetParam());
  for (Placement placement : {Placement::kAllInPool, Placement::kMixed}) {
    SCOPED_TRACE(PlacementName(placement));
    Stream store_stream, compute;
    KVTIER_ASSERT_GPU_OK(runtime_->CreateStream(&store_stream));
    KVTIER_ASSERT_GPU_OK(runtime_->CreateStream(&compute));
    LayerwiseRig rig;
    ASSERT_NO_FATAL_FAILURE(rig.Init(*runtime_, store_stream));
    std::vector<std::vector<uint8_t>> cache(LayerwiseRig::kLayers);
    for (int64_t l = 0; l < LayerwiseRig::kLayers; ++l) {
      KVTIER_ASSERT_GPU_OK(runtime_->LaunchFill(rig.tensors[l].data(), rig.span, 60 + l, compute));
      ASSERT_NO_FATAL_FAILURE(rig.ReadTensor(*runtime_, compute, rig.tensors[l].data(), &cache[l]));
    }
    DevicePool pool;
    ASSERT_NO_FATAL_FAILURE(MovePayloadsToPool(*runtime_, store_stream, placement, &pool, &rig));

    std::unique_ptr<LayerwiseStore> store;
    KVTIER_ASSERT_GPU_OK(LayerwiseStore::Create(*runtime_, PoolChunks(rig, pool, placement),
                                                rig.layers, options, store_stream, &store));
    for (int64_t l = 0; l < LayerwiseRig::kLayers; ++l) {
      KVTIER_ASSERT_GPU_OK(store->LayerWritten(l, compute));
    }
    KvCopyReport report;
    KVTIER_ASSERT_GPU_OK(store->Finish(&report));
    EXPECT_TRUE(report.failed_chunks.empty());
    for (int64_t c = 0; c < LayerwiseRig::kChunks; ++c) {
      for (int64_t l = 0; l < LayerwiseRig::kLayers; ++l) {
        std::vector<uint8_t> slice(rig.layer_bytes);  // Read back: pool slices are device memory.
        KVTIER_ASSERT_GPU_OK(
            runtime_->CopyAsync(slice.data(), rig.Slice(c, l), rig.layer_bytes, store_stream));
        KVTIER_ASSERT_GPU_OK(runtime_->Synchronize(store_stream));
        EXPECT_EQ(slice, rig.ExpectedSlice(c, cache[l])) << "chunk " << c << " layer " << l;
      }
    }
  }
}

}  // namespace
}  // namespace kvtier::gpu::testing
