# The libFuzzer build (KVTIER_FUZZ=ON), included by the top-level CMakeLists.txt before any
# module: clang, every target of ours compiled with coverage for libFuzzer (fuzzer-no-link)
# plus ASan and UBSan (an UB report aborts, so the fuzzer counts it as a crash), asserts on.
# System libraries (gRPC, Protobuf, RocksDB, yaml-cpp) are the gcc-built Debian ones,
# uninstrumented; clang links them through libstdc++ as g++ does.
if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "KVTIER_FUZZ needs clang for libFuzzer: configure with "
                      "-DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ (make fuzz does)")
endif()
# Only what the fuzz targets link: no Python extension, CUDA backend or GoogleTest suites.
set(KVTIER_PYTHON OFF)
set(KVTIER_WITH_CUDA OFF)
set(KVTIER_BUILD_TESTS OFF)
add_compile_options(-O2 -g -UNDEBUG -fno-omit-frame-pointer -fsanitize=fuzzer-no-link
                    -fsanitize=address,undefined -fno-sanitize-recover=all)
add_link_options(-fsanitize=address,undefined)
# -Wno-restrict is a g++ option that clang does not know.
set(KVTIER_WARNINGS -Wall -Wextra -Werror)
