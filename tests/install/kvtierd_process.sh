# Sourced by the tests beside it: one kvtierd process per test script.
#   kvtierd_start LOG SOCKET KVTIERD [ARGS...]  starts it (output to LOG), waits up to 30 s for
#                                              SOCKET; on failure prints LOG and returns 1
#   kvtierd_stop                               SIGTERM, waits; returns kvtierd's exit code
#   kvtierd_kill                               for an EXIT trap: stops it if still running
kvtierd_pid=""
kvtierd_log=""

kvtierd_start() {
  kvtierd_log=$1
  local sock=$2
  shift 2
  "$@" > "$kvtierd_log" 2>&1 &
  kvtierd_pid=$!
  for _ in $(seq 1 300); do
    [ -S "$sock" ] && return 0
    if ! kill -0 "$kvtierd_pid" 2>/dev/null; then
      cat "$kvtierd_log" >&2
      echo "kvtierd exited before listening on $sock" >&2
      kvtierd_pid=""
      return 1
    fi
    sleep 0.1
  done
  cat "$kvtierd_log" >&2
  echo "kvtierd did not listen on $sock within 30 s" >&2
  return 1
}

kvtierd_stop() {
  local rc=0
  kill -TERM "$kvtierd_pid"
  wait "$kvtierd_pid" || rc=$?
  kvtierd_pid=""
  return "$rc"
}

kvtierd_kill() {
  if [ -n "$kvtierd_pid" ] && kill -0 "$kvtierd_pid" 2>/dev/null; then
    kill -TERM "$kvtierd_pid" 2>/dev/null || true
    wait "$kvtierd_pid" 2>/dev/null || true
  fi
}
