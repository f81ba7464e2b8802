// The compute-operation suite on the CUDA backend (label gpu); every test skips when
// Runtime::CreateCuda fails (no GPU, no driver, or built without CUDA).
#include <gtest/gtest.h>

#include "compute_behaviour_test.h"

namespace kvtier::gpu::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(Cuda, ComputeBehaviourTest, ::testing::Values(Backend::kCuda),
                         BackendName);

}  // namespace
}  // namespace kvtier::gpu::testing
