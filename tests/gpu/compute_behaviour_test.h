// The compute-operation suite (compute_behaviour_test.cc), instantiated for the host backend
// by compute_test.cc and for CUDA by compute_cuda_test.cc (skipping without a GPU).
#pragma once

#include "runtime_test_support.h"

namespace kvtier::gpu::testing {

class ComputeBehaviourTest : public RuntimeBehaviourTest {};

}  // namespace kvtier::gpu::testing
