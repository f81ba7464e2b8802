#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan; tests/fuzz/CMakeLists.txt) and runs them.
#
#   tests/fuzz/run.sh smoke [TARGET...]   each target over its seed corpus, then briefly
#                                         (make fuzz-smoke; make test runs it in the ASan tree,
#                                         FUZZ_BUILD_DIR=build-asan, from tools/sanitizers/test.sh)
#   tests/fuzz/run.sh long  [TARGET...]   each target FUZZ_RUNS times (make fuzz)
#   tests/fuzz/run.sh build               only build them
#
# Environment: FUZZ_JOBS (targets run at once; smoke: JOBS, long: 1), FUZZ_BUILD_DIR (default
# build-fuzz, configured here when absent; an existing clang ASan tree, configured by
# tools/sanitizers/test.sh, has the targets too), JOBS (build jobs, default nproc),
# FUZZ_RUNS (long: runs per target, default 1000000), FUZZ_SMOKE_RUNS and FUZZ_SMOKE_SECONDS
# (smoke: runs per target after the seed corpus, default 10000, at most this many seconds,
# default 30). Seeds come from tests/fuzz/corpus/<target>/ and stay untouched; new inputs go
# to $FUZZ_BUILD_DIR/corpus/<target>/, crashes to $FUZZ_BUILD_DIR/artifacts/ (turn each
# into a unit test), each run's log and figures to $FUZZ_BUILD_DIR/logs/ and report.txt.
# Exit status: nonzero when a target crashed (the report names the input).
set -euo pipefail
cd "$(dirname "$0")/../.."

mode="${1:-smoke}"
shift || true
BUILD="${FUZZ_BUILD_DIR:-build-fuzz}"
JOBS="${JOBS:-$(nproc)}"
ALL=(fuzz_parse_bytes fuzz_slot_header fuzz_nvme_index fuzz_rebuild_index fuzz_trace fuzz_config
     fuzz_cache_core fuzz_cache_core_nvme fuzz_control_ring)
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=("${ALL[@]}")

case "$mode" in
  smoke|long|build) ;;
  *) echo "fuzz: unknown mode '$mode' (smoke, long, build)" >&2; exit 2 ;;
esac
for cc in clang clang++; do
  command -v "$cc" >/dev/null || { echo "fuzz: $cc not found (make deps installs it)" >&2; exit 1; }
done

if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DKVTIER_FUZZ=ON -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    >"$BUILD.configure.log" 2>&1 || { cat "$BUILD.configure.log" >&2; exit 1; }
  mv "$BUILD.configure.log" "$BUILD/configure.log"
fi
build_start=$SECONDS
cmake --build "$BUILD" --target "${targets[@]}" -j "$JOBS"
echo "fuzz: built ${#targets[@]} targets in $((SECONDS - build_start)) s"
[ "$mode" = build ] && exit 0

if [ -z "${ASAN_SYMBOLIZER_PATH:-}" ] && [ -x /usr/bin/llvm-symbolizer-14 ]; then
  export ASAN_SYMBOLIZER_PATH=/usr/bin/llvm-symbolizer-14
fi
mkdir -p "$BUILD/artifacts" "$BUILD/logs"
report="$BUILD/report.txt"
echo "# $(date -u +%FT%TZ) $mode, $(git rev-parse --short HEAD 2>/dev/null || echo '?')" >>"$report"
# One target: its log in logs/<target>.<mode>.log, its report line in logs/<target>.<mode>.line.
fuzz_one() {
  local t="$1" seeds work args seed_count log start status runs rate line
  seeds="tests/fuzz/corpus/${t%_nvme}"  # fuzz_cache_core_nvme reads fuzz_cache_core's inputs
  work="$BUILD/corpus/$t"
  mkdir -p "$work"
  args=(-timeout=60 -rss_limit_mb=4096 -print_final_stats=1 "-artifact_prefix=$BUILD/artifacts/$t-")
  [ -f "tests/fuzz/$t.dict" ] && args+=("-dict=tests/fuzz/$t.dict")
  # A CacheCore input is a sequence of calls: long ones from the start, not grown slowly.
  [[ "$t" == fuzz_cache_core* ]] && args+=(-max_len=2048 -len_control=0)
  if [ "$mode" = smoke ]; then
    seed_count=$(find "$seeds" -type f 2>/dev/null | wc -l || true)
    args+=(-seed=1 "-runs=$(( ${FUZZ_SMOKE_RUNS:-10000} + seed_count ))"
           "-max_total_time=${FUZZ_SMOKE_SECONDS:-30}")
  else
    args+=("-runs=${FUZZ_RUNS:-1000000}")
  fi
  log="$BUILD/logs/$t.$mode.log"
  start=$SECONDS
  status=0
  "$BUILD/bin/$t" "${args[@]}" "$work" "$seeds" >"$log" 2>&1 || status=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  line="$t: ${runs:-?} runs in $((SECONDS - start)) s (${rate:-?} exec/s)"
  if [ "$status" -ne 0 ]; then
    line+=" FAILED (exit $status): $(grep -m1 -E 'Test unit written to' "$log" || echo "see $log")"
  fi
  echo "$line" >"$BUILD/logs/$t.$mode.line"
  return "$status"
}

for t in "${targets[@]}"; do
  [ -d "tests/fuzz/corpus/${t%_nvme}" ] || {
    echo "fuzz: tests/fuzz/corpus/${t%_nvme} is missing (every target has seeds)" >&2; exit 1; }
done
# FUZZ_JOBS targets at once: smoke, JOBS (each fuzzer is one process on one core); long, 1.
if [ "$mode" = smoke ]; then parallel="${FUZZ_JOBS:-$JOBS}"; else parallel="${FUZZ_JOBS:-1}"; fi
rm -f "$BUILD"/logs/*."$mode".line
running=0
for t in "${targets[@]}"; do
  if [ "$running" -ge "$parallel" ]; then wait -n || true; running=$((running - 1)); fi
  fuzz_one "$t" &
  running=$((running + 1))
done
wait || true
failed=()
for t in "${targets[@]}"; do
  line=$(cat "$BUILD/logs/$t.$mode.line" 2>/dev/null || echo "$t: no result (see $BUILD/logs)")
  if [[ "$line" != *" runs in "* || "$line" == *FAILED* ]]; then
    failed+=("$t")
    grep -m5 -E 'FUZZ_CHECK|ERROR:|SUMMARY' "$BUILD/logs/$t.$mode.log" >&2 || true
  fi
  echo "fuzz: $line"
  echo "$line" >>"$report"
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: ${failed[*]} failed; logs in $BUILD/logs, inputs in $BUILD/artifacts" >&2
  exit 1
fi
