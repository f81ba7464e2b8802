// The KV gather/scatter and layerwise suites on the CUDA backend (CTest label `gpu`).
// Every test skips when Runtime::CreateCuda fails: no GPU, no driver, or built without
// CUDA. Injected copy failures exist only in host emulation (kv_transfer_test.cc).

#include <gtest/gtest.h>

#include "kv_transfer_behaviour_test.h"

namespace kvtier::gpu::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(Cuda, KvTransferTest, KvTransferParams(Backend::kCuda),
                         KvTransferTestName);
INSTANTIATE_TEST_SUITE_P(Cuda, LayerwiseTest, LayerwiseParams(Backend::kCuda), LayerwiseTestName);

}  // namespace
}  // namespace kvtier::gpu::testing
