#!/usr/bin/env bash
# Builds the kvtier Python wheel into $1 (default build/wheels) with the base venv's pip,
# scikit-build-core and nanobind (no download: --no-build-isolation).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-build/wheels}"
venvs="${KVTIER_VENV_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/kvtier/venvs}"
"$venvs/base/bin/python" -m pip wheel --no-build-isolation --no-deps -w "$out" ./client/python
ls -l "$out"/kvtier-*.whl
