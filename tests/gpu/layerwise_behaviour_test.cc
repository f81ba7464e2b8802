// Layerwise load/store behaviour every backend must show, on both copy paths.
// Queued work is held back with a Gate so that ordering is checked deterministically; the
// host backend's event completion times then prove that compute of layer i started only
// after layer i's copies completed.

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "kv_transfer_behaviour_test.h"
#include "kvtier/gpu/layerwise_load.h"
#include "kvtier/gpu/layerwise_store.h"
#include "layerwise_rig.h"
#include "runtime_test_support.h"

namespace kvtier::gpu::testing {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kSettle = std::chrono::milliseconds(50);

TEST_P(LayerwiseTest, ComputeOfALayerStartsOnlyAfterItsCopiesAndSeesTheChunks) {
  const CopyPath path = std::get<1>(GetParam());
  Stream load_stream, compute;
  KVTIER_ASSERT_GPU_OK(runtime_->CreateStream(&load_stream));
  KVTIER_ASSERT_GPU_OK(runtime_->CreateStream(&compute));
  LayerwiseRig rig;
  ASSERT_NO_FATAL_FAILURE(rig.Init(*runtime_, load_stream));
  KvTransferOptions options;
  options.path = path;
  std::unique_ptr<LayerwiseLoad> load;
  KVTIER_ASSERT_GPU_OK(
      LayerwiseLoad::Create(*runtime_, rig.Chunks(), rig.layers, options, load_stream, &load));
  EXPECT_EQ(load->WaitLayer(0, compute).code(), GpuCode::kInvalidArgument) << "before Start";
  KVTIER_ASSERT_GPU_OK(runtime_->Synchronize(load_stream));  // Uploads done before the gate.

  std::vector<DeviceBuffer> snapshots(LayerwiseRig::kLayers);
  for (DeviceBuffer& b : snapshots) KVTIER_ASSERT_GPU_OK(runtime_->Allocate(rig.span, &b));
  // Written by compute's host functions only; shared so it outlives them on early return.
  struct Seen {
    std::vector<Clock::time_point> started = std::vector<Clock::time_point>(LayerwiseRig::kLayers);
    std::atomic<int> count{0};
  };
  auto seen = std::make_shared<Seen>();

  Gate gate;  // After the streams: destroyed (opened) first.
  KVTIER_ASSERT_GPU_OK(runtime_->LaunchHostFunc(load_stream, gate.Waiter()));
  KVTIER_ASSERT_GPU_OK(load->Start());
  for (int64_t i = 0; i < LayerwiseRig::kLayers; ++i) {
    // The emulated attention of layer i: stamps its start, then reads layer i's cache.
    KVTIER_ASSERT_GPU_OK(load->WaitLayer(i, compute));
    KVTIER_ASSERT_GPU_OK(runtime_->LaunchHostFunc(compute, [seen, i] {
      seen->started[i] = Clock::now();
      seen->count.fetch_add(1);
    }));
    KVTIER_ASSERT_GPU_OK(
        runtime_->CopyAsync(snapshots[i].data(), rig.tensors[i].data(), rig.span, compute));
  }
  std::this_thread::sleep_for(kSettle);
  EXPECT_EQ(seen->count.load(), 0) << "compute ran while the layer copies were held back";

  gate.Open();
  KvCopyReport report;
  KVTIER_ASSERT_GPU_OK(load->Finish(&report));
  EXPECT_TRUE(report.failed_chunks.empty());
  KVTIER_ASSERT_GPU_OK(runtime_->Synchronize(compute));
  ASSERT_EQ(seen->count.load(), LayerwiseRig::kLayers);

  const std::vector<uint8_t> zeros(rig.span, 0);
  for (int64_t i = 0; i < LayerwiseRig::kLayers; ++i) {
    std::vector<uint8_t> seen_bytes;
    ASSERT_NO_FATAL_FAILURE(rig.ReadTensor(*runtime_, compute, snapshots[i].data(), &seen_bytes));
    EXPECT_EQ(seen_bytes, rig.ExpectedTensor(i, zeros, [](int64_t) { return true; }))
        << "layer " << i << " as its compute saw it";
    Clock::time_point copied_at;
    const GpuStatus s = runtime_->EventCompletionTime(load->layer_event(i), &copied_at);
    if (s.code() == GpuCode::kUnsupported) continue;  // CUDA: no recorded times.
    KVTIER_ASSERT_GPU_OK(s);
    EXPECT_LE(copied_at, seen->started[i])
        << "compute of layer " << i << " began before its copies";
  }
}

TEST_P(LayerwiseTest, StoreGathersEachLayerOnlyAfterTheEngineWroteIt) {
  const CopyPath path = std::get<1>(GetParam());
  Stream store_stream, compute;
  KVTIER_ASSERT_GPU_OK(runtime_->CreateStream(&store_stream));
  KVTIER_ASSERT_GPU_OK(runtime_->CreateStream(&compute));
  LayerwiseRig rig;
  ASSERT_NO_FATAL_FAILURE(rig.Init(*runtime_, store_stream));
  // What the engine will write into each layer, and its host mirror.
  std::vector<DeviceBuffer> written(LayerwiseRig::kLayers);
  std::vector<std::vector<uint8_t>> written_host(LayerwiseRig::kLayers);
  for (int64_t i = 0; i < LayerwiseRig::kLayers; ++i) {
    KVTIER_ASSERT_GPU_OK(runtime_->Allocate(rig.span, &written[i]));
    KVTIER_ASSERT_GPU_OK(runtime_->LaunchFill(written[i].data(), rig.span, 40 + i, store_stream));
    ASSERT_NO_FATAL_FAILURE(
        rig.ReadTensor(*runtime_, store_stream, written[i].data(), &written_host[i]));
  }
  std::memset(rig.arena->data(), 0x5A, rig.arena->size());
  KvTransferOptions options;
  options.path = path;
  std::unique_ptr<LayerwiseStore> store;
  KVTIER_ASSERT_GPU_OK(
      LayerwiseStore::Create(*runtime_, rig.Chunks(), rig.layers, options, store_stream, &store));
  KVTIER_ASSERT_GPU_OK(runtime_->Synchronize(store_stream));

  Gate gate;
  KVTIER_ASSERT_GPU_OK(runtime_->LaunchHostFunc(compute, gate.Waiter()));
  for (int64_t i = 0; i < LayerwiseRig::kLayers; ++i) {
    KVTIER_ASSERT_GPU_OK(
        runtime_->CopyAsync(rig.tensors[i].data(), written[i].data(), rig.span, compute));
    KVTIER_ASSERT_GPU_OK(store->LayerWritten(i, compute));
  }
  EXPECT_EQ(store->LayerWritten(1, compute).code(), GpuCode::kInvalidArgument) << "twice";
  std::this_thread::sleep_for(kSettle);
  bool complete = true;
  KVTIER_ASSERT_GPU_OK(runtime_->QueryEvent(store->layer_event(0), &complete));
  EXPECT_FALSE(complete) << "layer 0 stored before the engine wrote it";

  const Clock::time_point opened_at = gate.Open();
  KvCopyReport report;
  KVTIER_ASSERT_GPU_OK(store->Finish(&report));
  EXPECT_TRUE(report.failed_chunks.empty());
  for (int64_t c = 0; c < LayerwiseRig::kChunks; ++c) {
    for (int64_t i = 0; i < LayerwiseRig::kLayers; ++i) {
      const uint8_t* slice = rig.Slice(c, i);
      EXPECT_EQ(std::vector<uint8_t>(slice, slice + rig.layer_bytes),
                rig.ExpectedSlice(c, written_host[i]))
          << "chunk " << c << " layer " << i;
    }
  }
  for (int64_t i = 0; i < LayerwiseRig::kLayers; ++i) {
    Clock::time_point stored_at;
    const GpuStatus s = runtime_->EventCompletionTime(store->layer_event(i), &stored_at);
    if (s.code() == GpuCode::kUnsupported) break;
    KVTIER_ASSERT_GPU_OK(s);
    EXPECT_GE(stored_at, opened_at);
  }
}

}  // namespace
}  // namespace kvtier::gpu::testing
