#!/usr/bin/env bash
# deb_test.sh BUILD_DIR VERSION: builds the .deb with CPack (as `make deb` does, into a scratch
# folder), unpacks it without root (dpkg-deb -x into a scratch root: no maintainer scripts
# run, nothing is registered with dpkg) and checks:
#   - the control fields (package kvtier, VERSION, Depends naming gRPC, from dpkg-shlibdeps or
#     the explicit list) and that /etc/kvtier/kvtierd.yaml is a conffile;
#   - the files: programs in /usr/bin, the unit in /usr/lib/systemd/system, the sample config
#     in /etc/kvtier, the SDK (headers, libkvtier.so, CMake package, kvtier.pc);
#   - ROOT/usr/bin/kvtierd --version prints VERSION;
#   - kvtier.pc unpacked anywhere points into that root (pkg-config --variable).
# Exit 0 when all pass; 77 (ctest: skipped) when dpkg-deb is absent.
set -euo pipefail
build_dir=$(cd "$1" && pwd)
version=$2
command -v dpkg-deb > /dev/null || { echo "deb_test: SKIP: no dpkg-deb"; exit 77; }

scratch=$(mktemp -d "${TMPDIR:-/tmp}/kvtier-deb-test.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
fail() { echo "deb_test: FAIL: $*" >&2; exit 1; }
step() { echo "deb_test: $*"; }

(cd "$build_dir" && timeout 300 cpack -G DEB --config CPackConfig.cmake -B "$scratch/out") \
  > "$scratch/cpack.log" 2>&1 < /dev/null ||
  { cat "$scratch/cpack.log" >&2; fail "cpack -G DEB failed or took over 300 s"; }
debs=("$scratch"/out/kvtier_"$version"_*.deb)
[ -f "${debs[0]}" ] || { ls -R "$scratch/out" >&2; fail "no kvtier_${version}_*.deb"; }
deb=${debs[0]}
step "built $(basename "$deb") ($(du -h "$deb" | cut -f1))"

[ "$(dpkg-deb -f "$deb" Package)" = kvtier ] || fail "Package is not kvtier"
[ "$(dpkg-deb -f "$deb" Version)" = "$version" ] || fail "Version is not $version"
depends=$(dpkg-deb -f "$deb" Depends)
case "$depends" in *libgrpc++*) ;; *) fail "Depends does not name libgrpc++: '$depends'" ;; esac
step "Depends: $depends"
dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./conffiles > "$scratch/conffiles" 2>/dev/null ||
  fail "the package has no conffiles"
grep -qx /etc/kvtier/kvtierd.yaml "$scratch/conffiles" || fail "kvtierd.yaml is not a conffile"

root=$scratch/root
dpkg-deb -x "$deb" "$root"
for f in usr/bin/kvtierd usr/bin/kvtierctl usr/bin/kvtier-replay usr/bin/kvtier-bench \
         usr/lib/systemd/system/kvtierd.service etc/kvtier/kvtierd.yaml \
         usr/include/kvtier/client.h usr/lib/pkgconfig/kvtier.pc \
         usr/lib/cmake/kvtier/kvtierConfig.cmake; do
  [ -e "$root/$f" ] || fail "/$f is not in the package"
done
ls "$root"/usr/lib/libkvtier.so.* > /dev/null 2>&1 || fail "no libkvtier.so.* in the package"
grep -qx "ExecStart=/usr/bin/kvtierd --config /etc/kvtier/kvtierd.yaml" \
  "$root/usr/lib/systemd/system/kvtierd.service" || fail "the unit's ExecStart is not /usr/bin/kvtierd"

# Nothing outside /usr and /etc (no /usr/local, no build paths).
extra=$(cd "$root" && find . -mindepth 1 -maxdepth 1 ! -name usr ! -name etc)
[ -z "$extra" ] || fail "the package installs outside /usr and /etc: $extra"

out=$("$root/usr/bin/kvtierd" --version)
step "kvtierd --version: $out"
[ "$out" = "kvtierd $version" ] || fail "kvtierd --version printed '$out', not 'kvtierd $version'"

PKG_CONFIG_PATH=$root/usr/lib/pkgconfig pkg-config --variable=includedir kvtier > "$scratch/inc"
[ "$(cd "$(cat "$scratch/inc")" && pwd)" = "$(cd "$root/usr/include" && pwd)" ] ||
  fail "kvtier.pc's includedir '$(cat "$scratch/inc")' is not the unpacked /usr/include"
step "PASS"
