#include "cublas_loader.h"

#include <dlfcn.h>

#include <mutex>
#include <string>

namespace kvtier::gpu::engine::internal {
namespace {

template <typename Fn>
bool Bind(void* lib, const char* symbol, Fn* out) {
  *out = reinterpret_cast<Fn>(dlsym(lib, symbol));
  return *out != nullptr;
}

}  // namespace

GpuStatus LoadCublas(const CublasApi** api) {
  static CublasApi loaded;
  static GpuStatus status;
  static std::once_flag once;
  std::call_once(once, [] {
    const std::string versioned = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
    void* lib = dlopen(versioned.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) lib = dlopen("libcublas.so", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      status = GpuStatus::Unavailable("cuBLAS (" + versioned + ") not found: " + dlerror() +
                                      " (add the CUDA toolkit's lib64 to LD_LIBRARY_PATH)");
      return;
    }
    // cublas_v2.h maps cublasCreate etc. to their _v2 symbols.
    const bool ok = Bind(lib, "cublasCreate_v2", &loaded.create) &&
                    Bind(lib, "cublasDestroy_v2", &loaded.destroy) &&
                    Bind(lib, "cublasSetStream_v2", &loaded.set_stream) &&
                    Bind(lib, "cublasGemmEx", &loaded.gemm_ex) &&
                    Bind(lib, "cublasGemmStridedBatchedEx", &loaded.gemm_strided_batched_ex) &&
                    Bind(lib, "cublasGetStatusName", &loaded.status_name) &&
                    Bind(lib, "cublasGetStatusString", &loaded.status_string);
    if (!ok) status = GpuStatus::Unavailable(std::string("cuBLAS symbol missing: ") + dlerror());
  });
  if (status.ok()) *api = &loaded;
  return status;
}

}  // namespace kvtier::gpu::engine::internal
