# KVTIER_SANITIZE: build every target of this project with sanitizers, so that the daemon and
# tools the tests start are instrumented as well as the tests themselves.
#   address  ASan + UBSan (UBSan does not recover: the first report ends the process)
#   thread   TSan
# `make test-asan` and `make test-tsan` use build-asan and build-tsan, and set the run-time
# options (tools/sanitizers/). Third-party libraries (gRPC, Protobuf, RocksDB, libstdc++) are
# the Debian builds, not instrumented. With g++, the host code of gpu/'s .cu files is
# instrumented too: nvcc hands each flag to the host g++ with -Xcompiler (device code is not
# instrumented). make test-asan builds with clang and without the CUDA backend.
# -O1 overrides the build type's -O3 (it builds faster and keeps stack traces exact); the
# build type still decides NDEBUG.
set(KVTIER_SANITIZE "" CACHE STRING "Sanitizers: empty (none), address (ASan + UBSan) or thread (TSan)")
set_property(CACHE KVTIER_SANITIZE PROPERTY STRINGS "" address thread)

if(KVTIER_SANITIZE STREQUAL "address")
  set(_kvtier_san_flags -fsanitize=address -fsanitize=undefined -fno-sanitize-recover=undefined)
  set(_kvtier_san_link -fsanitize=address,undefined)
elseif(KVTIER_SANITIZE STREQUAL "thread")
  # -Wno-error=tsan: GCC warns that TSan does not model std::atomic_thread_fence (the slot
  # sequence check in common/src/slot_image.cc uses fences); a warning, not an error, here.
  set(_kvtier_san_flags -fsanitize=thread -Wno-error=tsan)
  set(_kvtier_san_link -fsanitize=thread)
elseif(NOT KVTIER_SANITIZE STREQUAL "")
  message(FATAL_ERROR "KVTIER_SANITIZE must be empty, address or thread, not '${KVTIER_SANITIZE}'")
endif()

if(_kvtier_san_flags)
  list(APPEND _kvtier_san_flags -fno-omit-frame-pointer -O1 -g1)
  foreach(_flag IN LISTS _kvtier_san_flags)
    add_compile_options($<$<COMPILE_LANGUAGE:C,CXX>:${_flag}>
                        $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=${_flag}>)
  endforeach()
  add_link_options(${_kvtier_san_link})
  message(STATUS "kvtier: sanitizers ${KVTIER_SANITIZE} (${_kvtier_san_flags})")
endif()
