#!/usr/bin/env bash
# systemd_unit_test.sh BIN_DIR SOURCE_DIR: `systemd-analyze verify` on
# packaging/systemd/kvtierd.service, copied with ExecStart's /usr/bin/kvtierd pointed at the
# built kvtierd (verify checks that the command exists). verify exits 0 on unknown keys and
# bad values and only prints them, so any output is a failure here.
# Exit 0 when it passes; 77 (ctest: skipped) when systemd-analyze is absent.
set -euo pipefail
bin_dir=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
command -v systemd-analyze > /dev/null || { echo "systemd_unit_test: SKIP: no systemd-analyze"; exit 77; }

scratch=$(mktemp -d "${TMPDIR:-/tmp}/kvtier-unit-test.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
fail() { echo "systemd_unit_test: FAIL: $*" >&2; exit 1; }

unit=$src/packaging/systemd/kvtierd.service
grep -qx 'ExecStart=/usr/bin/kvtierd --config /etc/kvtier/kvtierd.yaml' "$unit" ||
  fail "ExecStart is not '/usr/bin/kvtierd --config /etc/kvtier/kvtierd.yaml'"
sed "s#^ExecStart=/usr/bin/kvtierd #ExecStart=$bin_dir/kvtierd #" "$unit" > "$scratch/kvtierd.service"
grep -q "^ExecStart=$bin_dir/kvtierd " "$scratch/kvtierd.service" || fail "ExecStart not rewritten"

rc=0
out=$(systemd-analyze verify --man=no "$scratch/kvtierd.service" 2>&1) || rc=$?
echo "systemd_unit_test: systemd-analyze $(systemd-analyze --version | head -1): exit $rc"
if [ "$rc" -ne 0 ] || [ -n "$out" ]; then
  echo "$out" >&2
  fail "systemd-analyze verify found problems in kvtierd.service"
fi
echo "systemd_unit_test: PASS"
