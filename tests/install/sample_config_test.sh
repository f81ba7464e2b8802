#!/usr/bin/env bash
# sample_config_test.sh BIN_DIR SOURCE_DIR: the sample config (packaging/kvtierd.yaml) and the
# unit (packaging/systemd/kvtierd.service) agree, and the real kvtierd starts from them:
#   - the config's socket lies in the unit's RuntimeDirectory (/run/D/), its NVMe path is the
#     unit's StateDirectory (/var/lib/D);
#   - kvtierd started with the unit's ExecStart arguments on the sample, with only /run/... and
#     /var/lib/... rewritten into scratch folders and the sizes scaled down by flags (flags win;
#     the file's values are still checked), serves: kvtierctl health answers, the NVMe slot file
#     and index are made in the state folder, and SIGTERM stops it with exit 0.
set -euo pipefail
bin_dir=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
unit=$src/packaging/systemd/kvtierd.service
sample=$src/packaging/kvtierd.yaml

scratch=$(mktemp -d "${TMPDIR:-/tmp}/kvtier-sample-test.XXXXXX")
# The slot file needs O_DIRECT (no tmpfs): the state folder goes in the working directory
# (the build tree), as the NVMe tests' folders do.
state=$(mktemp -d "$PWD/kvtier-sample-state.XXXXXX")
# shellcheck source=tests/install/kvtierd_process.sh
source "$(dirname "$0")/kvtierd_process.sh"
trap 'kvtierd_kill; rm -rf "$scratch" "$state"' EXIT
fail() { echo "sample_config_test: FAIL: $*" >&2; exit 1; }
step() { echo "sample_config_test: $*"; }

runtime_dir=$(sed -n 's/^RuntimeDirectory=//p' "$unit")
state_dir=$(sed -n 's/^StateDirectory=//p' "$unit")
[ -n "$runtime_dir" ] && [ -n "$state_dir" ] || fail "the unit lacks RuntimeDirectory= or StateDirectory="
grep -Eq "^socket: /run/$runtime_dir/[^/ ]+\$" "$sample" ||
  fail "the sample's socket is not in the unit's RuntimeDirectory /run/$runtime_dir"
grep -Eq "^nvme_paths: \[/var/lib/$state_dir\]" "$sample" ||
  fail "the sample's nvme_paths is not the unit's StateDirectory /var/lib/$state_dir"

# The unit's own arguments, with the sample rewritten into the scratch folders.
exec_start=$(sed -n 's/^ExecStart=//p' "$unit")
read -r -a argv <<< "$exec_start"
[ "${argv[0]}" = /usr/bin/kvtierd ] || fail "ExecStart runs ${argv[0]}, not /usr/bin/kvtierd"
config=$scratch/kvtierd.yaml
sed -e "s#/run/$runtime_dir#$scratch/run/$runtime_dir#g" -e "s#/var/lib/$state_dir#$state#g" \
  "$sample" > "$config"
mkdir -p -m 0700 "$scratch/run/$runtime_dir"  # as RuntimeDirectoryMode=0700 makes it
args=()
for a in "${argv[@]:1}"; do args+=("${a/\/etc\/kvtier\/kvtierd.yaml/$config}"); done
[[ " ${args[*]} " == *" $config "* ]] || fail "ExecStart does not give /etc/kvtier/kvtierd.yaml"
sock=$(sed -n 's/^socket: //p' "$config")

kvtierd_start "$scratch/kvtierd.log" "$sock" "$bin_dir/kvtierd" "${args[@]}" \
  --dram-bytes 64MiB --nvme-bytes 64MiB --metrics-address off || fail "kvtierd does not start"
health=$("$bin_dir/kvtierctl" --socket "$sock" --json health) ||
  { cat "$scratch/kvtierd.log" >&2; fail "kvtierctl health"; }
step "kvtierctl health: $health"
case "$health" in *'"serving":true'*|*'"serving": true'*) ;; *) fail "not serving" ;; esac
[ -f "$state/kvtier-slots.dat" ] || fail "no NVMe slot file in the state folder"
[ -d "$state/index" ] || fail "no NVMe index in the state folder"

rc=0
kvtierd_stop || rc=$?
cat "$scratch/kvtierd.log"
[ "$rc" -eq 0 ] || fail "kvtierd exited $rc after SIGTERM"
step "PASS"
