#!/usr/bin/env bash
# install_test.sh BUILD_DIR VERSION: `cmake --install BUILD_DIR` into a scratch prefix, then,
# against that prefix only:
#   1. every file the install promises is there (programs, library, package, .pc, unit,
#      sample config);
#   2. every installed header compiles on its own with only -I PREFIX/include;
#   3. the installed kvtierd starts on a scratch socket;
#   4. tests/install/consumer (find_package(kvtier) + kvtier::client) configures, builds and
#      makes a round trip (store, load, compare bytes, Health version) against it;
#   5. the same main.cc built with `pkg-config --cflags --libs kvtier` does the same.
# Exit 0 when all pass; the first failure prints what failed and exits 1.
set -euo pipefail
build_dir=$(cd "$1" && pwd)
version=$2
here=$(cd "$(dirname "$0")" && pwd)
CXX=${CXX:-g++}

scratch=$(mktemp -d "${TMPDIR:-/tmp}/kvtier-install-test.XXXXXX")
# shellcheck source=tests/install/kvtierd_process.sh
source "$here/kvtierd_process.sh"
trap 'kvtierd_kill; rm -rf "$scratch"' EXIT
fail() { echo "install_test: FAIL: $*" >&2; exit 1; }
step() { echo "install_test: $*"; }

prefix=$scratch/prefix
step "cmake --install $build_dir --prefix $prefix"
cmake --install "$build_dir" --prefix "$prefix" > "$scratch/install.log" 2>&1 ||
  { cat "$scratch/install.log" >&2; fail "cmake --install failed"; }

# 1. The files.
libdir=""
for d in lib lib64 lib/x86_64-linux-gnu lib/aarch64-linux-gnu; do
  if [ -e "$prefix/$d/libkvtier.so" ]; then libdir=$prefix/$d; break; fi
done
[ -n "$libdir" ] || fail "no libkvtier.so under $prefix/lib*"
for f in bin/kvtierd bin/kvtierctl bin/kvtier-replay bin/kvtier-bench; do
  [ -x "$prefix/$f" ] || fail "$f is not installed"
done
for f in "$libdir/cmake/kvtier/kvtierConfig.cmake" "$libdir/cmake/kvtier/kvtierConfigVersion.cmake" \
         "$libdir/cmake/kvtier/kvtierTargets.cmake" "$libdir/pkgconfig/kvtier.pc" \
         "$prefix/lib/systemd/system/kvtierd.service" "$prefix/etc/kvtier/kvtierd.yaml" \
         "$prefix/include/kvtier/client.h" "$prefix/include/kvtier/admin_client.h" \
         "$prefix/include/kvtier/layerwise.h"; do
  [ -f "$f" ] || fail "${f#"$prefix"/} is not installed"
done
# The soname carries major.minor (0.x), and the library needs nothing unresolved.
soname=$(readelf -d "$libdir/libkvtier.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = "libkvtier.so.${version%.*}" ] || fail "soname is '$soname', not libkvtier.so.${version%.*}"
[ -e "$libdir/$soname" ] || fail "$soname is not installed"
# The unit starts this install's kvtierd on this install's config (it said /usr/bin and
# /etc/kvtier under any prefix: a fresh-user trial's systemctl start failed).
grep -qx "ExecStart=$prefix/bin/kvtierd --config $prefix/etc/kvtier/kvtierd.yaml" \
  "$prefix/lib/systemd/system/kvtierd.service" ||
  fail "the installed unit's ExecStart is not $prefix/bin/kvtierd --config $prefix/etc/kvtier/kvtierd.yaml"
# No path of the build or source tree may leak into what a consumer reads.
if grep -rl -e "$build_dir" -e "$(cd "$here/../.." && pwd)/" "$libdir/cmake" "$libdir/pkgconfig" \
     "$prefix/include" 2>/dev/null; then
  fail "the installed package files above name the build or source tree"
fi

# 2. Each header alone, with only the prefix on the include path.
num_headers=0
while IFS= read -r h; do
  rel=${h#"$prefix/include/"}
  echo "#include <$rel>" | "$CXX" -std=c++20 -fsyntax-only -Wall -Wextra -Werror \
    -I "$prefix/include" -x c++ - 2> "$scratch/header.log" ||
    { cat "$scratch/header.log" >&2; fail "installed header $rel does not compile on its own"; }
  num_headers=$((num_headers + 1))
done < <(find "$prefix/include" -name '*.h' | sort)
step "$num_headers installed headers compile on their own"

# 3. The installed kvtierd, DRAM only, on a scratch socket (no metrics port).
sock=$scratch/run/kvtierd.sock
kvtierd_start "$scratch/kvtierd.log" "$sock" "$prefix/bin/kvtierd" --socket "$sock" \
  --dram-bytes 64MiB --nvme-bytes 0 --metrics-address off --log-level warn ||
  fail "the installed kvtierd does not start"
step "installed kvtierd serves $sock"

# 4. find_package(kvtier) + kvtier::client.
cmake -S "$here/consumer" -B "$scratch/consumer-cmake" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" -DKVTIER_EXPECTED_VERSION="$version" \
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF > "$scratch/consumer.log" 2>&1 &&
  cmake --build "$scratch/consumer-cmake" >> "$scratch/consumer.log" 2>&1 ||
  { cat "$scratch/consumer.log" >&2; fail "the find_package(kvtier) consumer does not build"; }
"$scratch/consumer-cmake/kvtier_consumer" "$sock" "$version" cmake-consumer ||
  fail "the find_package(kvtier) consumer's round trip"
step "find_package(kvtier) consumer: round trip passed"

# 5. pkg-config.
export PKG_CONFIG_PATH=$libdir/pkgconfig
[ "$(pkg-config --modversion kvtier)" = "$version" ] || fail "pkg-config --modversion kvtier"
read -r -a pc_flags <<< "$(pkg-config --cflags --libs kvtier)"
"$CXX" -std=c++20 -O1 "$here/consumer/main.cc" -o "$scratch/kvtier_consumer_pc" "${pc_flags[@]}" \
  -Wl,-rpath,"$(pkg-config --variable=libdir kvtier)" 2> "$scratch/pc.log" ||
  { cat "$scratch/pc.log" >&2; fail "the pkg-config consumer does not build"; }
"$scratch/kvtier_consumer_pc" "$sock" "$version" pkg-config-consumer || fail "the pkg-config consumer's round trip"
step "pkg-config consumer: round trip passed"

rc=0
kvtierd_stop || rc=$?
[ "$rc" -eq 0 ] || { cat "$scratch/kvtierd.log" >&2; fail "kvtierd exited $rc after SIGTERM"; }
step "PASS"
