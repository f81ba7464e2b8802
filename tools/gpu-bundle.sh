#!/usr/bin/env bash
# make gpu-bundle: a self-contained folder for a GPU machine with nothing
# installed (x86-64, an NVIDIA driver): kvtierd, kvtierctl and kvtier-gpu-e2e,
# their non-system shared libraries (all but the C library family; the CUDA
# runtime is linked statically), and run.sh, which starts kvtierd with an HBM
# tier, stores and loads a prompt's KV through it on the GPU (layerwise, CUDA
# backend): through the DRAM arena (H2D), then through the HBM pool over CUDA
# IPC (D2D), verifies every byte and prints the GB/s the client saw (the
# client's first store, which registers the arena, timed apart); and
# bench.sh, which runs kvtier-bench's CPU-side figures (lookup, dram, scale)
# against a DRAM-only kvtierd on that machine's cores.
#   bash tools/gpu-bundle.sh [BIN_DIR] [OUT_DIR]   (default build/bin, build/gpu-bundle)
set -euo pipefail
BIN=${1:-build/bin}
OUT=${2:-build/gpu-bundle}
rm -rf "$OUT"
mkdir -p "$OUT/bin" "$OUT/lib"
for b in kvtierd kvtierctl kvtier-gpu-e2e kvtier-bench; do
  [ -x "$BIN/$b" ] || { echo "gpu-bundle: $BIN/$b is missing (make build first)" >&2; exit 1; }
  cp "$BIN/$b" "$OUT/bin/"
done
for b in "$OUT"/bin/*; do ldd "$b" | awk '/=> \// {print $3}'; done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libresolv.so*|libcuda.so*) ;;
    *) cp -L "$lib" "$OUT/lib/" ;;
  esac
done
strip --strip-unneeded "$OUT"/bin/* "$OUT"/lib/* 2>/dev/null || true
cat > "$OUT/kvtierd.sh" <<'START'
# Sourced by run.sh and bench.sh. start_kvtierd NAME ARGS...: kvtierd on the
# private socket $S with ARGS and no NVMe tier, stopped (and $WORK removed) at
# exit; waits up to 30 s for it to answer health (pinning a large arena takes
# a while).
export LD_LIBRARY_PATH="$HERE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
WORK=$(mktemp -d)
chmod 700 "$WORK"
S="$WORK/kvtierd.sock"
start_kvtierd() {
  local name=$1
  shift
  "$HERE/bin/kvtierd" --socket "$S" --nvme-bytes 0 --log-level warn "$@" &
  PID=$!
  trap 'kill -TERM $PID 2>/dev/null || true; wait $PID 2>/dev/null || true; rm -rf "$WORK"' EXIT
  for _ in $(seq 1 300); do
    "$HERE/bin/kvtierctl" --socket "$S" health >/dev/null 2>&1 && return 0
    kill -0 $PID 2>/dev/null || { echo "$name: kvtierd did not start (its error is above)" >&2; exit 1; }
    sleep 0.1
  done
  echo "$name: kvtierd did not answer health within 30 s" >&2
  exit 1
}
START
cat > "$OUT/run.sh" <<'RUN'
#!/usr/bin/env bash
# Runs on the GPU machine: kvtierd on a private socket (DRAM arena 8 GiB, HBM
# pool 8 GiB on CUDA device ${GPU:-0}, no NVMe tier), then kvtier-gpu-e2e on the
# same device; prints its figures. BACKEND=host emulates the GPU (no GPU needed).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/kvtierd.sh"
start_kvtierd run.sh --dram-bytes "${DRAM:-8GiB}" --hbm-bytes "${HBM:-8GiB}" --gpu "${GPU:-0}" \
  --gpu-backend "${BACKEND:-cuda}" --metrics-address off
"$HERE/bin/kvtier-gpu-e2e" --socket "$S" --backend "${BACKEND:-cuda}" --device "${GPU:-0}" \
  --require-hbm "$@" &
E2E=$!
trap 'kill -TERM $E2E $PID 2>/dev/null || true; wait $PID 2>/dev/null || true; rm -rf "$WORK"' EXIT
trap 'exit 143' TERM INT
wait $E2E
RUN
cat > "$OUT/bench.sh" <<'BENCH'
#!/usr/bin/env bash
# Runs anywhere the bundle runs: kvtierd (DRAM arena ${DRAM:-4GiB}, no NVMe,
# no HBM) on a private socket, then kvtier-bench lookup (128K and 2K tokens),
# dram and scale (8 and 16 clients), each with its same-run baseline, on this
# machine's cores. A step that fails is reported and the rest still run; the
# exit status is that of the last failure.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/kvtierd.sh"
start_kvtierd bench.sh --dram-bytes "${DRAM:-4GiB}" --metrics-address off
echo "bench.sh: $(nproc) cores"
rc=0
step() {
  echo "== kvtier-bench $*"
  timeout 120 "$HERE/bin/kvtier-bench" --socket "$S" "$@" || { rc=$?; echo "bench.sh: kvtier-bench $* failed ($rc)"; }
}
step lookup
step lookup --prompt-tokens 2048 --iterations 2000
step dram
step scale --clients 8 --seconds 3
step scale --clients 16 --seconds 3
exit $rc
BENCH
chmod +x "$OUT/run.sh" "$OUT/bench.sh"
echo "gpu-bundle: $OUT ($(du -sh "$OUT" | cut -f1)); run $OUT/run.sh and $OUT/bench.sh on the GPU machine"
