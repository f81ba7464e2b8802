#!/usr/bin/env bash
# make gpu-check: for a machine with an NVIDIA GPU that has only the CUDA
# toolkit and cmake (no GoogleTest, gRPC or RocksDB, no package installs).
# Builds gpu/ standalone with nvcc, runs its checks on the CUDA backend (every
# layout round-trips bit-exact against the host emulation, which CI checks
# against an independent CPU reference), and prints H2D GB/s from a
# registered range vs cudaMemcpyAsync from cudaHostAlloc memory, and
# gather/scatter GB/s for both copy paths. Then the test engine, standalone
# (no daemon): TTFT of recompute, load-then-compute and layerwise load for a
# 32K-token prompt with 31K tokens cached, and the overlap ratio.
#   bash tools/gpu-check.sh [BUILD_DIR]   (default build-gpu-check)
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$REPO/build-gpu-check}
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[ -x "$NVCC" ] || { echo "gpu-check: nvcc not found (set NVCC=/path/to/nvcc)" >&2; exit 1; }
mkdir -p "$BUILD"
cmake -S "$REPO/gpu" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$NVCC" \
  -DKVTIER_WITH_CUDA=ON > "$BUILD/cmake.log" 2>&1 || { cat "$BUILD/cmake.log"; exit 1; }
cmake --build "$BUILD" -j "$(nproc)"
echo "== gpu-check (CUDA backend)"
set +e
"$BUILD/gpu-check" --backend cuda
rc=$?
set -e
if [ $rc -eq 2 ]; then
  echo "gpu-check: no usable CUDA device here; nothing was measured" >&2
  exit 2
fi
[ $rc -eq 0 ] || exit $rc
echo "== test engine (standalone: llama3-8b, 32K-token prompt, 31K cached; KV prefix in pinned host memory)"
"$BUILD/kvtier-engine-standalone" --backend cuda --model llama3-8b --prompt-tokens 32768 \
  --cached-tokens 31744 --iterations 3
