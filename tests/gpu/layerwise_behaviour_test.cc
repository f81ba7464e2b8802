// Layerwise load/store behaviour every backend must show, on both copy paths.
// Queued work is held back with a Gate so that ordering is checked deterministically; the
// host backend's event completion times then prove that compute of layer i started only
// after layer i's copies completed.

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
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

// A load test's streams and rig, and a load of the rig's chunks.
struct LoadSetup {
  Stream load_stream, compute;
  LayerwiseRig rig;
  std::unique_ptr<LayerwiseLoad> load;

  // Streams and rig (its uploads queued on load_stream).
  void Init(Runtime& runtime) {
    KVTIER_ASSERT_GPU_OK(runtime.CreateStream(&load_stream));
    KVTIER_ASSERT_GPU_OK(runtime.CreateStream(&compute));
    ASSERT_NO_FATAL_FAILURE(rig.Init(runtime, load_stream));
  }
  void CreateLoad(Runtime& runtime, CopyPath path, int64_t queue_ahead_layers) {
    KvTransferOptions options;
    options.path = path;
    options.queue_ahead_layers = queue_ahead_layers;
    KVTIER_ASSERT_GPU_OK(
        LayerwiseLoad::Create(runtime, rig.Chunks(), rig.layers, options, load_stream, &load));
  }
  // Every layer's tensor holds what the rig's chunks put over zeros.
  void ExpectEveryLayerLoaded(Runtime& runtime) {
    const std::vector<uint8_t> zeros(rig.span, 0);
    for (int64_t i = 0; i < LayerwiseRig::kLayers; ++i) {
      std::vector<uint8_t> bytes;
      ASSERT_NO_FATAL_FAILURE(rig.ReadTensor(runtime, compute, rig.tensors[i].data(), &bytes));
      EXPECT_EQ(bytes, rig.ExpectedTensor(i, zeros, [](int64_t) { return true; })) << "layer " << i;
    }
  }
};

TEST_P(LayerwiseTest, ComputeOfALayerStartsOnlyAfterItsCopiesAndSeesTheChunks) {
  LoadSetup t;
  ASSERT_NO_FATAL_FAILURE(t.Init(*runtime_));
  ASSERT_NO_FATAL_FAILURE(
      t.CreateLoad(*runtime_, std::get<1>(GetParam()), KvTransferOptions{}.queue_ahead_layers));
  Stream& load_stream = t.load_stream;
  Stream& compute = t.compute;
  LayerwiseRig& rig = t.rig;
  LayerwiseLoad* load = t.load.get();
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

// Start queues queue_ahead_layers layers, WaitLayer(i) tops the queue up to layer i + that,
// and Finish queues the rest: a launch on the load stream between those calls runs after
// the layers queued before it and before the ones queued after it. (Queueing every layer
// at Start blocked the engine's thread on CUDA's launch queue before its first compute.)
TEST_P(LayerwiseTest, LayersAreQueuedOnlyAheadOfTheEnginesWait) {
  LoadSetup t;
  ASSERT_NO_FATAL_FAILURE(t.Init(*runtime_));
  ASSERT_NO_FATAL_FAILURE(t.CreateLoad(*runtime_, std::get<1>(GetParam()), 1));
  Stream& load_stream = t.load_stream;
  LayerwiseLoad* load = t.load.get();
  KVTIER_ASSERT_GPU_OK(runtime_->Synchronize(load_stream));
  // marks[k]: when the load stream reached the k-th marker.
  auto marks = std::make_shared<std::vector<Clock::time_point>>(2);
  KVTIER_ASSERT_GPU_OK(load->Start());  // layer 0
  KVTIER_ASSERT_GPU_OK(
      runtime_->LaunchHostFunc(load_stream, [marks] { (*marks)[0] = Clock::now(); }));
  KVTIER_ASSERT_GPU_OK(load->WaitLayer(0, t.compute));  // layer 1
  KVTIER_ASSERT_GPU_OK(
      runtime_->LaunchHostFunc(load_stream, [marks] { (*marks)[1] = Clock::now(); }));
  KvCopyReport report;
  KVTIER_ASSERT_GPU_OK(load->Finish(&report));  // layers 2 and 3
  EXPECT_TRUE(report.failed_chunks.empty());
  ASSERT_NO_FATAL_FAILURE(t.ExpectEveryLayerLoaded(*runtime_));
  std::vector<Clock::time_point> copied(LayerwiseRig::kLayers);
  for (int64_t i = 0; i < LayerwiseRig::kLayers; ++i) {
    const GpuStatus s = runtime_->EventCompletionTime(load->layer_event(i), &copied[i]);
    if (s.code() == GpuCode::kUnsupported) return;  // CUDA: no recorded times.
    KVTIER_ASSERT_GPU_OK(s);
  }
  EXPECT_LE(copied[0], (*marks)[0]);
  EXPECT_LT((*marks)[0], copied[1]) << "Start queued layer 1 (more than 1 layer ahead)";
  EXPECT_LE(copied[1], (*marks)[1]);
  EXPECT_LT((*marks)[1], copied[2]) << "WaitLayer(0) queued layer 2 (more than 1 layer ahead)";
}

// With no WaitLayer calls (load, then compute), Finish delivers every layer, however far
// ahead the load queues; 0 queues them all at Start; a negative distance is refused.
TEST_P(LayerwiseTest, ALoadWithoutWaitLayerIsWholeAfterFinishForAnyQueueAhead) {
  const CopyPath path = std::get<1>(GetParam());
  LoadSetup t;
  ASSERT_NO_FATAL_FAILURE(t.Init(*runtime_));
  for (int64_t ahead : {int64_t{0}, int64_t{1}, int64_t{2}, LayerwiseRig::kLayers + 5}) {
    SCOPED_TRACE("queue_ahead_layers " + std::to_string(ahead));
    for (DeviceBuffer& tensor : t.rig.tensors) {
      KVTIER_ASSERT_GPU_OK(runtime_->LaunchMemset(tensor.data(), 0, t.rig.span, t.load_stream));
    }
    ASSERT_NO_FATAL_FAILURE(t.CreateLoad(*runtime_, path, ahead));
    KVTIER_ASSERT_GPU_OK(t.load->Start());
    KvCopyReport report;
    KVTIER_ASSERT_GPU_OK(t.load->Finish(&report));
    EXPECT_TRUE(report.failed_chunks.empty());
    ASSERT_NO_FATAL_FAILURE(t.ExpectEveryLayerLoaded(*runtime_));
  }
  KvTransferOptions negative;
  negative.path = path;
  negative.queue_ahead_layers = -1;
  std::unique_ptr<LayerwiseLoad> load;
  const GpuStatus s = LayerwiseLoad::Create(*runtime_, t.rig.Chunks(), t.rig.layers, negative,
                                            t.load_stream, &load);
  EXPECT_EQ(s.code(), GpuCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("queue_ahead_layers -1"), std::string::npos) << s.ToString();
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
