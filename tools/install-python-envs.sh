#!/usr/bin/env bash
# Creates the project's Python virtual environments, only those missing or out of date.
# Idempotent: a second run with the same pins installs nothing.
#
#   base    pybind11, scikit-build-core, numpy, pytest, mypy: builds the `kvtier` package
#           and runs its own tests (no engine).
#   peers   Mooncake Store's CPU build (mooncake_master and its client) for kvtier-bench peers.
#   vllm    the pinned vLLM (with its CUDA torch wheels, ~9.4 GB) plus pytest.
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

envs=("$@")
[ ${#envs[@]} -eq 0 ] && envs=(base peers vllm sglang)

for env in "${envs[@]}"; do
  req="$REQ_DIR/$env.txt"
  if [ ! -f "$req" ]; then
    echo "install-python-envs: no pins for '$env' ($req missing)" >&2
    exit 2
  fi
  dir="$ROOT/$env"
  stamp="$(cat "$req" <("$PYTHON" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-16)"
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
  echo "$stamp" > "$dir/.kvtier-stamp"
  echo "install-python-envs: $env venv ready in $(( $(date +%s) - start )) s"
done
