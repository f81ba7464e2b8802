#!/usr/bin/env bash
# Formats the repository's C++ and CUDA sources with clang-format 14 (.clang-format), or, with
# --check, lists the files it would change and fails. Another clang-format major version lays
# some code out differently, so this one is pinned (tools/install-deps.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
CLANG_FORMAT=${CLANG_FORMAT:-clang-format-14}
if ! command -v "$CLANG_FORMAT" >/dev/null 2>&1; then
  echo "format: $CLANG_FORMAT not found (bash tools/install-deps.sh installs it)" >&2
  exit 1
fi
mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh' '*.inc')
if [ "${1:-}" = "--check" ]; then
  # One clang-format for every file; each file it would change is named in its warnings.
  mapfile -t bad < <("$CLANG_FORMAT" --dry-run "${files[@]}" 2>&1 |
    sed -n 's/^\([^:]*\):[0-9]*:[0-9]*: warning: code should be clang-formatted.*/\1/p' |
    sort -u)
  if [ ${#bad[@]} -ne 0 ]; then
    echo "format: ${#bad[@]} of ${#files[@]} files differ from $CLANG_FORMAT's layout" \
      "(bash tools/format.sh rewrites them):" >&2
    printf '  %s\n' "${bad[@]}" >&2
    exit 1
  fi
  echo "format: ${#files[@]} files as $CLANG_FORMAT lays them out"
else
  "$CLANG_FORMAT" -i "${files[@]}"
fi
