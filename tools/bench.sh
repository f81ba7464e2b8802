#!/usr/bin/env bash
# make bench: start kvtierd on temporary sockets and run every kvtier-bench
# benchmark against it; each prints its same-run baseline and the ratio.
set -euo pipefail
BIN=${1:-build/bin}
WORK=$(mktemp -d /tmp/kvtier-bench.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

start_daemon() {  # start_daemon NAME DRAM_BYTES
  "$BIN/kvtierd" --socket "$WORK/$1.sock" --dram-bytes "$2" --nvme-bytes 0 --metrics-address off --log-level warn &
  PIDS+=($!)
  for _ in $(seq 1 100); do
    "$BIN/kvtierctl" --socket "$WORK/$1.sock" health >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "kvtierd did not come up" >&2; exit 1
}

CLIENT_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824
start_daemon dram 2GiB
"$BIN/kvtier-bench" --socket "$WORK/dram.sock" dram
echo
# The same request through the Python binding (build/python) vs numpy memcpy.
VENVS="${KVTIER_VENV_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/kvtier/venvs}"
PYTHONPATH="$BIN/../python" "$VENVS/base/bin/python" client/python/bench/bench_python.py \
  --socket "$WORK/dram.sock"
echo
"$BIN/kvtier-bench" --socket "$WORK/dram.sock" lookup
echo
# The same with the client process keeping freed heap memory (what kvtierd does
# itself): shows how much of the lookup is the client's malloc returning and
# refaulting the buffers of each 512 KiB request.
echo "(client with GLIBC_TUNABLES=$CLIENT_TUNABLES)"
GLIBC_TUNABLES=$CLIENT_TUNABLES "$BIN/kvtier-bench" --socket "$WORK/dram.sock" lookup
echo
# Eight clients at once vs one alone, over the control ring and over gRPC.
"$BIN/kvtier-bench" --socket "$WORK/dram.sock" scale
echo
# Put + get through the SDK beside Redis on loopback (started and stopped by the benchmark).
"$BIN/kvtier-bench" --socket "$WORK/dram.sock" peers
echo
# The remote tier vs pipelined hiredis on a 3-master Redis Cluster it starts on loopback.
"$BIN/kvtier-bench" remote
echo
# Making room in a full tier of long prefix chains (in process, no daemon).
"$BIN/kvtier-bench" evict
echo
start_daemon memory 4000MiB
"$BIN/kvtier-bench" --socket "$WORK/memory.sock" memory
echo
# The NVMe tier's I/O path (not yet serving kvtierd's requests) vs fio on the same file.
"$BIN/kvtier-bench" nvme --dir "${KVTIER_BENCH_NVME_DIR:-./kvtier-bench-nvme}" --file-bytes 1GiB
echo
# kvtierd start-to-serving with 1,000,000 chunks on NVMe (vs an empty tier).
"$BIN/kvtier-bench" restart --kvtierd "$BIN/kvtierd" --dir "${KVTIER_BENCH_RESTART_DIR:-./kvtier-bench-restart}"
