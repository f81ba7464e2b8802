// cuBLAS, loaded with dlopen at the first GEMM: only the test engine's compute
// needs it, so no other binary links or carries it (make gpu-bundle stays
// small, and a machine without cuBLAS runs everything else).
#pragma once

#include <cublas_v2.h>

#include "kvtier/gpu/gpu_status.h"

namespace kvtier::gpu::engine::internal {

struct CublasApi {
  decltype(&cublasCreate) create = nullptr;
  decltype(&cublasDestroy) destroy = nullptr;
  decltype(&cublasSetStream) set_stream = nullptr;
  // The C entry points (C++ also sees inline overloads taking cudaDataType compute types).
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                            const void*, const void*, cudaDataType, int, const void*, cudaDataType,
                            int, const void*, void*, cudaDataType, int, cublasComputeType_t,
                            cublasGemmAlgo_t) = nullptr;
  cublasStatus_t (*gemm_strided_batched_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t,
                                            int, int, int, const void*, const void*, cudaDataType,
                                            int, long long, const void*, cudaDataType, int,
                                            long long, const void*, void*, cudaDataType, int,
                                            long long, int, cublasComputeType_t,
                                            cublasGemmAlgo_t) = nullptr;
  decltype(&cublasGetStatusName) status_name = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
};

// The API from libcublas.so.<major of the headers> (or libcublas.so), loaded
// once per process. Thread-safe. Errors: kUnavailable naming the library and
// dlerror() when it or a symbol is missing.
GpuStatus LoadCublas(const CublasApi** api);

}  // namespace kvtier::gpu::engine::internal
