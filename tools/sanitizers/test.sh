#!/usr/bin/env bash
# make test-asan / make test-tsan: builds kvtier with sanitizers into its own build folder and
# runs the tests there, with the run-time options below (children such as kvtierd inherit them).
#   tools/sanitizers/test.sh address [BUILD_DIR] [JOBS]   ASan + UBSan (clang): every C++ test,
#                                                          then each libFuzzer target briefly
#                                                          (tests/fuzz/run.sh smoke, same tree)
#   tools/sanitizers/test.sh thread  [BUILD_DIR] [JOBS]   TSan (g++): CacheCore, WritePipelined,
#                                                          client, integration (builds only
#                                                          the programs these run)
# With KVTIER_SAN_SCOPE=core (make sanitize-smoke) it builds and runs only the test programs of
# common/, tiers/ and daemon/ (CacheCore and its tiers: with address, all of them; with
# thread, CacheCore's and the NVMe writer's pipeline), each program directly.
# The Python extension is not built (a sanitized extension needs the sanitizer runtime
# preloaded into python), so the Python tests do not run here. GPU tests skip without a GPU.
# A sanitizer report exits with 86, and fails the test whose process (test binary, kvtierd,
# kvtierctl, ...) printed it (tests/testing/daemon_process.h). Prints the wall time.
set -euo pipefail
cd "$(dirname "$0")/../.."
kind="${1:?usage: test.sh address|thread [BUILD_DIR] [JOBS]}"
jobs="${3:-$(nproc)}"
supp="$PWD/tools/sanitizers"

case "$kind" in
  address)
    build="${2:-build-asan}"
    # protect_shadow_gap=0: the CUDA driver maps memory where ASan's shadow gap is (GPU runs).
    # allocator_may_return_null=1: a huge allocation fails (nullptr, std::bad_alloc) as in a
    # plain build, instead of ending the process: tests check that such failures are clean.
    export ASAN_OPTIONS="halt_on_error=1:exitcode=86:detect_leaks=1:strict_init_order=1:check_initialization_order=1:detect_stack_use_after_return=1:protect_shadow_gap=0:allocator_may_return_null=1"
    export UBSAN_OPTIONS="halt_on_error=1:exitcode=86:print_stacktrace=1"
    # clang: it builds this configuration in about two thirds of g++'s time. The CUDA backend
    # (nvcc's host compiler is g++, whose ASan runtime is not clang's) is left out; the GPU
    # tests run on host emulation here as everywhere without a GPU.
    configure=(-DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DKVTIER_WITH_CUDA=OFF)
    if [ -z "${ASAN_SYMBOLIZER_PATH:-}" ] && [ -x /usr/bin/llvm-symbolizer-14 ]; then
      export ASAN_SYMBOLIZER_PATH=/usr/bin/llvm-symbolizer-14
    fi
    ctest_args=()
    ;;
  thread)
    build="${2:-build-tsan}"
    # halt_on_error=0: a run shows every race; the process still exits 86 at the end.
    # ignore_noninstrumented_modules=1 and tsan.supp: gRPC is not built with TSan (see there).
    export TSAN_OPTIONS="halt_on_error=0:exitcode=86:second_deadlock_stack=1:ignore_noninstrumented_modules=1:suppressions=$supp/tsan.supp:print_suppressions=0"
    # CacheCore (daemon_cache_core_*, below), the client SDK and the integration tests, except
    # those that time calls against a wall-clock bound (TSan makes every call 5-15x slower) and
    # the full-disk test (its replays of the whole trace take over 300 s each under TSan). The
    # ASan run has them all.
    excluded='^(FullDiskTest\.|ClientDeadline\.|StoppedDaemonTest\.|DaemonTest\.ClientFailsOpenWhileDaemonIsDown)'
    ctest_args=(-L integration -E "$excluded")
    configure=()  # g++ (and its libtsan)
    ;;
  *) echo "test.sh: the first argument is address or thread, not '$kind'" >&2; exit 2 ;;
esac

# The build's targets whose names match an extended regex, one per line. `help` lists them as
# "... NAME" (Makefiles) or "NAME: phony" (Ninja).
targets() {
  cmake --build "$build" --target help |
    sed -n -e 's/^\.\.\. //p' -e 's/^\([A-Za-z0-9_.-]*\): phony$/\1/p' | grep -E "$1" | sort -u
}

start=$(date +%s)
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVTIER_SANITIZE="$kind" -DKVTIER_PYTHON=OFF \
    "${configure[@]}"
fi
if [ "${KVTIER_SAN_SCOPE:-all}" = core ]; then
  if [ "$kind" = address ]; then pattern='^(common|tiers|daemon)_.*_test$'; else pattern='^(daemon_cache_core.*|tiers_write_pipeline)_test$'; fi
  programs=$(targets "$pattern")
  cmake --build "$build" -j "$jobs" --target $programs kvtierd
  built=$(date +%s)
  status=0
  export KVTIER_BIN_DIR="$PWD/$build/bin"
  for p in $programs; do
    rc=0
    "$build/bin/$p" --gtest_brief=1 >"$build/$p.log" 2>&1 || rc=$?
    if [ "$rc" -ne 0 ]; then
      status=$rc
      cat "$build/$p.log"
    fi
    echo "test.sh $kind: $p exit $rc"
  done
  end=$(date +%s)
  echo "test.sh $kind (core): build $((built - start)) s, tests $((end - built)) s, total $((end - start)) s"
  exit "$status"
fi
if [ "$kind" = thread ]; then
  # Only what the runs below start: the integration label's programs (tests/CMakeLists.txt
  # gathers them, with the daemon and tools they run, in kvtier_tests_integration) and
  # CacheCore's and the write pipeline's suites.
  cmake --build "$build" -j "$jobs" --target kvtier_tests_integration \
    $(targets '^(daemon_cache_core.*|tiers_write_pipeline)_test$')
else
  cmake --build "$build" -j "$jobs"
fi
built=$(date +%s)
cd "$build"
status=0
ctest --output-on-failure --timeout 900 -j "$jobs" "${ctest_args[@]}" || status=$?
if [ "$kind" = thread ]; then
  ctest --output-on-failure --timeout 900 -j "$jobs" -R '^(CacheCore|WritePipelinedTest)' || status=$?
fi
cd - >/dev/null
if [ "$kind" = address ]; then
  # The fuzz targets were built above with everything else. The fuzzers run with the sanitizers'
  # default options, as in their own build (libFuzzer bounds memory itself: -rss_limit_mb).
  env -u ASAN_OPTIONS -u UBSAN_OPTIONS FUZZ_BUILD_DIR="$build" JOBS="$jobs" \
    bash tests/fuzz/run.sh smoke || status=$?
fi
end=$(date +%s)
echo "test.sh $kind: build $((built - start)) s, tests $((end - built)) s, total $((end - start)) s"
exit "$status"
