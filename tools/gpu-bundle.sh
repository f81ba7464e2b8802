#!/usr/bin/env bash
# make gpu-bundle: a self-contained folder for a GPU machine with nothing
# installed (x86-64, an NVIDIA driver): kvtierd, kvtierctl and kvtier-gpu-e2e,
# their non-system shared libraries (all but the C library family; the CUDA
# runtime is linked statically), and run.sh, which starts kvtierd with an HBM
# tier, stores and loads a prompt's KV through it on the GPU (layerwise, CUDA
# backend): through the DRAM arena (H2D), then through the HBM pool over CUDA
# IPC (D2D), verifies every byte and prints the GB/s the client saw.
#   bash tools/gpu-bundle.sh [BIN_DIR] [OUT_DIR]   (default build/bin, build/gpu-bundle)
set -euo pipefail
BIN=${1:-build/bin}
OUT=${2:-build/gpu-bundle}
rm -rf "$OUT"
mkdir -p "$OUT/bin" "$OUT/lib"
for b in kvtierd kvtierctl kvtier-gpu-e2e; do
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
cat > "$OUT/run.sh" <<'RUN'
#!/usr/bin/env bash
# Runs on the GPU machine: kvtierd on a private socket (DRAM arena 8 GiB, HBM
# pool 8 GiB on CUDA device ${GPU:-0}, no NVMe tier), then kvtier-gpu-e2e on the
# same device; prints its figures. BACKEND=host emulates the GPU (no GPU needed).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH="$HERE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
WORK=$(mktemp -d)
chmod 700 "$WORK"
"$HERE/bin/kvtierd" --socket "$WORK/kvtierd.sock" --dram-bytes "${DRAM:-8GiB}" --nvme-bytes 0 \
  --hbm-bytes "${HBM:-8GiB}" --gpu "${GPU:-0}" --gpu-backend "${BACKEND:-cuda}" --log-level warn &
PID=$!
trap 'kill -TERM $PID 2>/dev/null || true; wait $PID 2>/dev/null || true; rm -rf "$WORK"' EXIT
for _ in $(seq 1 300); do  # 30 s: pinning a large arena takes a while
  "$HERE/bin/kvtierctl" --socket "$WORK/kvtierd.sock" health >/dev/null 2>&1 && break
  kill -0 $PID 2>/dev/null || { echo "run.sh: kvtierd did not start (its error is above)" >&2; exit 1; }
  sleep 0.1
done
"$HERE/bin/kvtierctl" --socket "$WORK/kvtierd.sock" health >/dev/null 2>&1 ||
  { echo "run.sh: kvtierd did not answer health within 30 s" >&2; exit 1; }
"$HERE/bin/kvtier-gpu-e2e" --socket "$WORK/kvtierd.sock" --backend "${BACKEND:-cuda}" --device "${GPU:-0}" \
  --require-hbm "$@" &
E2E=$!
trap 'kill -TERM $E2E $PID 2>/dev/null || true; wait $PID 2>/dev/null || true; rm -rf "$WORK"' EXIT
trap 'exit 143' TERM INT
wait $E2E
RUN
chmod +x "$OUT/run.sh"
echo "gpu-bundle: $OUT ($(du -sh "$OUT" | cut -f1)); run $OUT/run.sh on the GPU machine"
