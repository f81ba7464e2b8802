// Backend-parameterized fixtures of the KV copy tests (kv_transfer_behaviour_test.cc,
// layerwise_behaviour_test.cc). The host executable instantiates them for Backend::kHost,
// the gpu executable for Backend::kCuda (skipping when Runtime::CreateCuda fails).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>

#include "kv_test_support.h"
#include "kvtier/gpu/kv_copy.h"
#include "kvtier/gpu/kv_layout.h"
#include "kvtier/gpu/runtime.h"

namespace kvtier::gpu::testing {

// (backend, layout case, element bytes, block size in tokens).
using KvTransferParam = std::tuple<Backend, KvCase, uint32_t, int64_t>;

class KvTransferTest : public ::testing::TestWithParam<KvTransferParam> {
 protected:
  void SetUp() override;

  std::unique_ptr<Runtime> runtime_;
  KvLayoutSpec spec_;
  KvLayout layout_;
};

std::string KvTransferTestName(const ::testing::TestParamInfo<KvTransferParam>& info);

// Every layout case x element size x block size (chunks of 16 tokens), for one backend.
inline auto KvTransferParams(Backend backend) {
  return ::testing::Combine(
      ::testing::Values(backend),
      ::testing::Values(KvCase::kFlashAttn, KvCase::kFlashAttnHnd, KvCase::kFlashInfer,
                        KvCase::kFlashInferPadded, KvCase::kSglang, KvCase::kSglangDimMajor,
                        KvCase::kMla, KvCase::kMlaPadded, KvCase::kBhnc, KvCase::kBhncNhd),
      ::testing::Values(1u, 2u, 4u), ::testing::Values(int64_t{1}, int64_t{4}, int64_t{16}));
}

// (backend, copy path).
using LayerwiseParam = std::tuple<Backend, CopyPath>;

class LayerwiseTest : public ::testing::TestWithParam<LayerwiseParam> {
 protected:
  void SetUp() override {
    GpuStatus s;
    runtime_ = MakeRuntime(std::get<0>(GetParam()), &s);
    if (!s.ok()) GTEST_SKIP() << "no usable GPU: " << s.ToString();
  }
  std::unique_ptr<Runtime> runtime_;
};

inline std::string LayerwiseTestName(const ::testing::TestParamInfo<LayerwiseParam>& info) {
  return std::string(std::get<0>(info.param) == Backend::kHost ? "host_" : "cuda_") +
         std::string(CopyPathName(std::get<1>(info.param)));
}

inline auto LayerwiseParams(Backend backend) {
  return ::testing::Combine(::testing::Values(backend),
                            ::testing::Values(CopyPath::kDma, CopyPath::kZeroCopy));
}

}  // namespace kvtier::gpu::testing
