#!/usr/bin/env bash
# The multi-node replay (docs/BENCHMARKS.md, "Several nodes"): the conversation
# trace across N = 1, 2 and 4 kvtierd sharing one Redis Cluster (3 masters on
# loopback, started here), routed round robin and by prefix (the nodes' KV
# events). Each run gets fresh nodes and an empty cluster. Prints one table per
# run (kvtier-replay --nodes) and a summary line per run.
#
#   tools/bench-nodes.sh [BIN] [REQUESTS]      default: build/bin, 3000
#   NODE_DRAM=256MiB NODE_NVME=512MiB NODES="1 2 4" tools/bench-nodes.sh
set -euo pipefail
BIN=${1:-$(dirname "$0")/../build/bin}
REQUESTS=${2:-3000}
NODE_DRAM=${NODE_DRAM:-256MiB}
NODE_NVME=${NODE_NVME:-512MiB}
NODES=${NODES:-1 2 4}  # the node counts to run
TRACE=${TRACE:-$(dirname "$0")/../data/traces/conversation_trace.jsonl}  # from any directory
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kvtier-nodes.XXXXXX")  # not tmpfs: NVMe files need O_DIRECT
REDIS_PIDS=()
NODE_PIDS=()
stop_nodes() {
  for p in "${NODE_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  NODE_PIDS=()
}
cleanup() {
  stop_nodes
  for p in "${REDIS_PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# The cluster: 3 masters, no replicas, persistence off.
PORTS=()
for i in 0 1 2; do
  port=$(free_port)
  mkdir -p "$WORK/redis$i"
  (cd "$WORK/redis$i" && exec redis-server --port "$port" --cluster-port "$(free_port)" --cluster-enabled yes \
     --cluster-config-file nodes.conf --save '' --appendonly no --loglevel warning \
     > redis.log 2>&1) &
  REDIS_PIDS+=($!)
  PORTS+=("$port")
done
for port in "${PORTS[@]}"; do
  for _ in $(seq 1 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
done
redis-cli --cluster create "${PORTS[@]/#/127.0.0.1:}" --cluster-yes >/dev/null
for _ in $(seq 1 100); do
  redis-cli -p "${PORTS[0]}" cluster info | grep -q 'cluster_state:ok' && break
  sleep 0.1
done
URL="redis://127.0.0.1:${PORTS[0]},127.0.0.1:${PORTS[1]},127.0.0.1:${PORTS[2]}"

start_node() {  # start_node NAME
  mkdir -p "$WORK/$1"
  "$BIN/kvtierd" --socket "$WORK/$1.sock" --dram-bytes "$NODE_DRAM" --nvme-path "$WORK/$1" \
    --nvme-bytes "$NODE_NVME" --remote "$URL" --events-address "ipc://$WORK/$1.events" \
    --metrics-address off --log-level warn &
  NODE_PIDS+=($!)
  for _ in $(seq 1 100); do
    "$BIN/kvtierctl" --socket "$WORK/$1.sock" health >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "kvtierd $1 did not come up" >&2; exit 1
}

echo "kvtier multi-node replay: $REQUESTS requests of $TRACE; per node DRAM $NODE_DRAM, NVMe $NODE_NVME;"
echo "one Redis Cluster of 3 masters on loopback ($URL)"
SUMMARY=()
for n in $NODES; do
  for route in round_robin prefix; do
    [ "$n" = 1 ] && [ "$route" = prefix ] && continue  # one node: nothing to route
    for port in "${PORTS[@]}"; do redis-cli -p "$port" flushall >/dev/null; done
    sockets=()
    for i in $(seq 1 "$n"); do
      start_node "n$n-$route-$i"
      sockets+=("$WORK/n$n-$route-$i.sock")
    done
    echo
    echo "== N=$n, route $route"
    json="$WORK/n$n-$route.json"
    "$BIN/kvtier-replay" --nodes "$(IFS=,; echo "${sockets[*]}")" --route "$route" \
      --trace "$TRACE" --limit "$REQUESTS" --quiet --deadline-ms 5000 --json "$json"
    SUMMARY+=("$(python3 - "$json" "$n" "$route" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1])); t = j["total"]
rates = " ".join(f'{n["token_hit_rate"]:.3f}' for n in j["nodes"])
print(f'N={sys.argv[2]} {sys.argv[3]:<11} total {t["token_hit_rate"]:.4f}  per node [{rates}]  '
      f'remote hit tokens {t["tiers"]["remote"]["hit_tokens"]}  '
      f'loaded {t["bytes_loaded"] / 2**20:.0f} MiB (remote {t["tiers"]["remote"]["bytes_loaded"] / 2**20:.0f})  '
      f'stored {t["bytes_stored"] / 2**20:.0f} MiB  wall {t["wall_s"]:.1f} s  verify errors {t["verify_errors"]}')
EOF
)")
    stop_nodes
  done
done
echo
echo "== summary"
printf '%s\n' "${SUMMARY[@]}"
