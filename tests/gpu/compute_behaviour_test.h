// The compute-operation suite (compute_behaviour_test.cc), instantiated for the host backend
// by compute_test.cc and for CUDA by compute_cuda_test.cc (skipping without a GPU).
#pragma once

#include <memory>

#include "kvtier/gpu/engine/compute.h"
#include "runtime_test_support.h"

namespace kvtier::gpu::testing {

// runtime_ and, unless the backend skipped, compute_ on it.
class ComputeBehaviourTest : public RuntimeBehaviourTest {
 protected:
  void SetUp() override {
    RuntimeBehaviourTest::SetUp();
    if (runtime_ != nullptr) compute_ = std::make_unique<engine::Compute>(*runtime_);
  }

  std::unique_ptr<engine::Compute> compute_;
};

}  // namespace kvtier::gpu::testing
