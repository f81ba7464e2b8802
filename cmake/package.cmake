# `make deb`: one Debian package, kvtier, of everything cmake/install.cmake installs, with
# /usr as its prefix (the sample config at /etc/kvtier/kvtierd.yaml, a conffile), written to
# build/packages/kvtier_<version>_<arch>.deb. Run as `cpack -G DEB` in the build folder
# (make deb; tests/install/deb_test.sh runs it into a folder of its own).
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME kvtier)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "Tiered KV-cache offload daemon (kvtierd), its client SDK and kvtierctl")
set(CPACK_PACKAGE_DIRECTORY ${CMAKE_BINARY_DIR}/packages)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # kvtier_0.1.0_amd64.deb
set(KVTIER_DEB_MAINTAINER "kvtier maintainers" CACHE STRING
    "Maintainer field of the .deb (make deb), e.g. 'Name <email>'")
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${KVTIER_DEB_MAINTAINER}")
set(CPACK_DEBIAN_PACKAGE_SECTION misc)
# Only what install.cmake installs (not the Python wheel's component).
set(CPACK_COMPONENTS_ALL sdk daemon)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_GROUPING ALL_COMPONENTS_IN_ONE)
# Install with DESTDIR and prefix /usr, so that install.cmake puts the config in /etc.
set(CPACK_SET_DESTDIR ON)
set(CPACK_INSTALL_PREFIX /usr)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${CMAKE_SOURCE_DIR}/packaging/debian/conffiles)
# Depends: from the binaries' and libkvtier.so's DT_NEEDED (dpkg-shlibdeps, in dpkg-dev, and file),
# or this list of the Debian 12 packages that hold them.
find_program(KVTIER_DPKG_SHLIBDEPS dpkg-shlibdeps)
find_program(KVTIER_FILE file)  # CPack runs it to find the ELF files
if(KVTIER_DPKG_SHLIBDEPS AND KVTIER_FILE)
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
else()
  # The packages of the DT_NEEDED libraries of kvtierd, kvtierctl, kvtier-replay,
  # kvtier-bench and libkvtier.so on Debian 12 (bookworm).
  set(CPACK_DEBIAN_PACKAGE_DEPENDS "libc6, libstdc++6, libgcc-s1, libgrpc++1.51, libgrpc29, \
libprotobuf32, libabsl20220623, libspdlog1.10, libfmt9, libxxhash0, librocksdb7.8, liburing2, \
libyaml-cpp0.7, libcpp-httplib0.11, libhiredis0.14, libzmq5, libsodium23")
endif()
include(CPack)
