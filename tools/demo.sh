#!/usr/bin/env bash
# make demo: start kvtierd on a temporary socket with its embedded defaults
# (DRAM arena 1 GiB, NVMe tier write-through) but a 2 GiB NVMe file under the
# build folder instead of 8 GiB under ./kvtier-data, replay the first 1,000
# requests of the Mooncake conversation trace with real bytes (they outgrow
# DRAM, so NVMe serves hits too), print the summary and `kvtierctl stats`,
# stop the daemon.
set -euo pipefail
BIN=${1:-build/bin}
REPO=$(cd "$(dirname "$0")/.." && pwd)
TRACE="$REPO/data/traces/conversation_trace.jsonl"
WORK=$(mktemp -d /tmp/kvtier-demo.XXXXXX)
SOCK="$WORK/kvtierd.sock"
# On the build folder's disk: the NVMe tier needs O_DIRECT, which tmpfs may refuse.
NVME_DIR="$BIN/../demo-nvme"
DAEMON_PID=""
cleanup() {
  if [ -n "$DAEMON_PID" ] && kill -0 "$DAEMON_PID" 2>/dev/null; then
    kill -TERM "$DAEMON_PID"; wait "$DAEMON_PID" 2>/dev/null || true
  fi
  rm -rf "$WORK" "$NVME_DIR"
}
trap cleanup EXIT

rm -rf "$NVME_DIR" && mkdir -p "$NVME_DIR"
echo "== starting kvtierd (DRAM arena 1 GiB, NVMe 2 GiB in $(cd "$NVME_DIR" && pwd)) on $SOCK"
"$BIN/kvtierd" --socket "$SOCK" --nvme-path "$NVME_DIR" --nvme-bytes 2GiB \
  --metrics-address off --log-level warn &  # 9400 stays free for a production kvtierd
DAEMON_PID=$!
for _ in $(seq 1 100); do
  "$BIN/kvtierctl" --socket "$SOCK" health >/dev/null 2>&1 && break
  sleep 0.1
done
"$BIN/kvtierctl" --socket "$SOCK" health

if [ -f "$TRACE" ]; then
  echo "== replaying the first 1,000 requests of $(basename "$TRACE") (model tiny, 256-token chunks)"
  SOURCE=(--trace "$TRACE" --limit 1000)
else
  echo "== $TRACE not found: replaying 1,000 requests of the built-in multi-turn generator instead"
  SOURCE=(--generate 1000)
fi
"$BIN/kvtier-replay" --socket "$SOCK" "${SOURCE[@]}" --model tiny --json "$WORK/replay.json"
echo
echo "== kvtierctl stats"
"$BIN/kvtierctl" --socket "$SOCK" stats
