#!/usr/bin/env bash
# Installs the Debian 12 packages kvtier builds and tests with, only those missing, then the
# project's Python venvs (tools/install-python-envs.sh): `base` and `peers` always, and with
# --engines the vLLM and SGLang ones too (about 10 GB and 3-5 minutes each on a fresh machine).
# Idempotent: a second run installs nothing. Runs apt-get as root, or through sudo.
set -euo pipefail
cd "$(dirname "$0")/.."

envs=(base peers)
for arg in "$@"; do
  case "$arg" in
    --engines) envs=(base peers vllm sglang) ;;
    *) echo "install-deps: unknown argument '$arg' (known: --engines)" >&2; exit 2 ;;
  esac
done

PACKAGES=(
  cmake ninja-build g++ make pkg-config
  librocksdb-dev liburing-dev
  libgrpc++-dev protobuf-compiler-grpc protobuf-compiler libprotobuf-dev
  libxxhash-dev libspdlog-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libyaml-cpp-dev libcli11-dev libcpp-httplib-dev nlohmann-json3-dev
  fio
  gnuplot-nox  # kvtier-replay --sweep draws its plot (tools/plot-sweep.gp)
  dpkg-dev file systemd  # make deb (dpkg-shlibdeps, which CPack runs with file); systemd-analyze
  zsh  # kvtierctl completion zsh is checked with zsh -n
  redis-server libhiredis-dev  # the remote tier (RedisCluster), its tests, kvtier-bench peers
  libzmq3-dev cppzmq-dev libmsgpack-cxx-dev  # KV events (--events-address)
  libsodium-dev  # the remote tier's keyed MAC (--remote-key-file)
  python3 python3-dev python3-venv
  clang libclang-rt-14-dev llvm-14  # libFuzzer and llvm-symbolizer (make fuzz, fuzz-smoke)
  clang-format-14  # tools/format.sh (make format, format-check; make test checks)
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exec bash tools/install-python-envs.sh "${envs[@]}"
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
  else
    echo "install-deps: not root and no sudo; install these by hand: ${missing[*]}" >&2
    exit 1
  fi
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
exec bash tools/install-python-envs.sh "${envs[@]}"
