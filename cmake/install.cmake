# What `cmake --install build --prefix P` (and `make install`, `make deb`) puts under P:
#   bin/                        kvtierd, kvtierctl, kvtier-replay, kvtier-bench
#   include/kvtier/             the client SDK's public headers and every header of common/
#                               and gpu/ they include (followed transitively)
#   lib/libkvtier.so.0.1        the client SDK as one shared library (kvtier::client)
#   lib/cmake/kvtier/           find_package(kvtier CONFIG): kvtier::client, version file
#   lib/pkgconfig/kvtier.pc     pkg-config --cflags --libs kvtier
#   lib/systemd/system/         kvtierd.service
#   etc/kvtier/kvtierd.yaml     the sample config (/etc/kvtier when P is /usr; an existing
#                               file is kept)
#   share/doc/kvtier/README.md
# libkvtier.so holds the SDK with common/, gpu/ and the generated wire code inside; gRPC,
# Protobuf, spdlog and xxHash are its own DT_NEEDED libraries, so a consumer needs only the
# headers and the library (nothing to find_dependency), and does not build against our
# gRPC/Protobuf. The in-tree tools and the Python extension keep linking the static
# kvtier_client. Included by the top-level CMakeLists.txt (not in KVTIER_PYTHON_ONLY,
# sanitizer or fuzz builds).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
# Installing (and cpack, which runs the `preinstall` target) must not build the whole tree,
# tests included: make install and make deb build kvtier_installed, below, first.
set(CMAKE_SKIP_INSTALL_ALL_DEPENDENCY ON)

# --- the shared SDK library --------------------------------------------------------------
# Built from the static libraries' objects (all PIC): the public headers reach into common/
# and gpu/ (NamespaceSpec, Status, the gpu runtime), so all of them go in, not only what the
# client's objects happen to call. kvtier_client as a private link dependency brings their
# link dependencies (kvtier_proto, gRPC, Protobuf, spdlog, xxHash, threads, static cudart).
add_library(kvtier_sdk SHARED
  $<TARGET_OBJECTS:kvtier_client> $<TARGET_OBJECTS:kvtier_common> $<TARGET_OBJECTS:kvtier_gpu>)
add_dependencies(kvtier_sdk kvtier_client kvtier_common kvtier_gpu)
target_link_libraries(kvtier_sdk PRIVATE kvtier_client)
# The headers need C++20 (<span>, among others): consumers compile as C++20.
target_compile_features(kvtier_sdk INTERFACE cxx_std_20)
target_include_directories(kvtier_sdk INTERFACE $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
# 0.x: any minor release may change the ABI, so the soname carries major.minor.
set(KVTIER_SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})
set_target_properties(kvtier_sdk PROPERTIES
  OUTPUT_NAME kvtier
  EXPORT_NAME client
  VERSION ${PROJECT_VERSION}
  SOVERSION ${KVTIER_SOVERSION}
  LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/lib)
# With the CUDA backend, kvtier_gpu's objects include device code: link as C++ (no device
# link step, as for kvtier_gpu's other consumers) for the same architectures.
get_target_property(_kvtier_cuda_archs kvtier_gpu CUDA_ARCHITECTURES)
if(_kvtier_cuda_archs)
  set_target_properties(kvtier_sdk PROPERTIES CUDA_ARCHITECTURES "${_kvtier_cuda_archs}"
                                              LINKER_LANGUAGE CXX)
endif()
# Every symbol must resolve inside the library or its DT_NEEDED ones.
target_link_options(kvtier_sdk PRIVATE -Wl,--no-undefined)

# --- public headers: the client's, and what they include, transitively -------------------
# kvtier_header_closure(OUT ROOTS... ): every `#include "kvtier/..."` reachable from ROOTS
# (files under KVTIER_HEADER_DIRS), as "relative/path.h|/absolute/path.h" pairs in OUT.
set(KVTIER_HEADER_DIRS ${CMAKE_SOURCE_DIR}/client/include ${CMAKE_SOURCE_DIR}/common/include
                       ${CMAKE_SOURCE_DIR}/gpu/include)
function(kvtier_header_closure out)
  set(queue ${ARGN})
  set(seen)
  set(pairs)
  while(queue)
    list(POP_FRONT queue rel)
    if(rel IN_LIST seen)
      continue()
    endif()
    list(APPEND seen ${rel})
    set(abs)
    foreach(dir IN LISTS KVTIER_HEADER_DIRS)
      if(EXISTS ${dir}/${rel})
        set(abs ${dir}/${rel})
        break()
      endif()
    endforeach()
    if(NOT abs)
      message(FATAL_ERROR "public header ${rel} is in none of ${KVTIER_HEADER_DIRS}")
    endif()
    list(APPEND pairs "${rel}|${abs}")
    file(STRINGS ${abs} includes REGEX "^#include \"kvtier/")
    foreach(line IN LISTS includes)
      string(REGEX REPLACE "^#include \"([^\"]+)\".*" "\\1" inc "${line}")
      list(APPEND queue ${inc})
    endforeach()
  endwhile()
  set(${out} ${pairs} PARENT_SCOPE)
endfunction()

file(GLOB _kvtier_client_headers RELATIVE ${CMAKE_SOURCE_DIR}/client/include
     ${CMAKE_SOURCE_DIR}/client/include/kvtier/*.h)
kvtier_header_closure(_kvtier_public_headers ${_kvtier_client_headers})
foreach(pair IN LISTS _kvtier_public_headers)
  string(REPLACE "|" ";" pair "${pair}")
  list(GET pair 0 rel)
  list(GET pair 1 abs)
  get_filename_component(rel_dir ${rel} DIRECTORY)
  # Configure runs again when one changes (an include added to a public header).
  set_property(DIRECTORY ${CMAKE_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${abs})
  install(FILES ${abs} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/${rel_dir} COMPONENT sdk)
endforeach()

# --- library, CMake package, pkg-config ---------------------------------------------------
set(KVTIER_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/kvtier)
install(TARGETS kvtier_sdk EXPORT kvtierTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT sdk NAMELINK_COMPONENT sdk)
install(EXPORT kvtierTargets NAMESPACE kvtier:: DESTINATION ${KVTIER_CMAKE_DIR} COMPONENT sdk)
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/kvtierConfig.cmake.in
  ${CMAKE_BINARY_DIR}/install/kvtierConfig.cmake INSTALL_DESTINATION ${KVTIER_CMAKE_DIR})
# 0.x: a minor release may break the API, so only the same major.minor is compatible.
write_basic_package_version_file(${CMAKE_BINARY_DIR}/install/kvtierConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/install/kvtierConfig.cmake
              ${CMAKE_BINARY_DIR}/install/kvtierConfigVersion.cmake
        DESTINATION ${KVTIER_CMAKE_DIR} COMPONENT sdk)
# kvtier.pc finds the prefix from its own place (${pcfiledir}), so it is right wherever the
# tree is installed: --prefix at install time, DESTDIR, a .deb unpacked anywhere.
file(RELATIVE_PATH KVTIER_PC_TO_PREFIX /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
string(REGEX REPLACE "/$" "" KVTIER_PC_TO_PREFIX "${KVTIER_PC_TO_PREFIX}")  # ../..
configure_file(${CMAKE_SOURCE_DIR}/cmake/kvtier.pc.in ${CMAKE_BINARY_DIR}/install/kvtier.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/install/kvtier.pc
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT sdk)

# --- programs, systemd unit, sample config ------------------------------------------------
set(_kvtier_programs kvtierd kvtierctl kvtier-replay)
if(TARGET kvtier-bench)
  list(APPEND _kvtier_programs kvtier-bench)
endif()
install(TARGETS ${_kvtier_programs} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT daemon)
# What `cmake --install` needs built (make install and make deb build only this).
add_custom_target(kvtier_installed DEPENDS ${_kvtier_programs} kvtier_sdk)
# The unit's Documentation= names it.
install(FILES ${CMAKE_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT daemon)
# The sample config goes to PREFIX/etc/kvtier, or to /etc/kvtier when PREFIX is /usr (the
# rule GNUInstallDirs applies at configure time, applied here at install time since
# --prefix may change it then); an absolute CMAKE_INSTALL_SYSCONFDIR wins. A file already
# there is an operator's config: `make install` keeps it (the .deb marks it a conffile).
install(CODE "set(_kvtier_sample \"${CMAKE_SOURCE_DIR}/packaging/kvtierd.yaml\")
  set(_kvtier_unit \"${CMAKE_SOURCE_DIR}/packaging/systemd/kvtierd.service\")
  set(_kvtier_unit_out \"${CMAKE_BINARY_DIR}/install/kvtierd.service\")
  set(_kvtier_bindir \"${CMAKE_INSTALL_BINDIR}\")
  set(_kvtier_sysconf \"${CMAKE_INSTALL_SYSCONFDIR}\")" COMPONENT daemon)
install(CODE [[
  if(IS_ABSOLUTE "${_kvtier_sysconf}")
    set(_kvtier_etc "${_kvtier_sysconf}/kvtier")
  elseif(CMAKE_INSTALL_PREFIX MATCHES "^/usr/?$")
    set(_kvtier_etc "/etc/kvtier")
  else()
    set(_kvtier_etc "${CMAKE_INSTALL_PREFIX}/${_kvtier_sysconf}/kvtier")
  endif()
  if(EXISTS "$ENV{DESTDIR}${_kvtier_etc}/kvtierd.yaml")
    message(STATUS "Keeping: $ENV{DESTDIR}${_kvtier_etc}/kvtierd.yaml (the sample is "
                   "${_kvtier_sample})")
  else()
    file(INSTALL DESTINATION "${_kvtier_etc}" TYPE FILE FILES "${_kvtier_sample}")
  endif()
  # The unit, in lib/systemd/system under the prefix (/usr/lib/systemd/system in the .deb,
  # which systemd reads on every distribution), with ExecStart naming this install's
  # kvtierd and config: the source says /usr/bin and /etc/kvtier.
  file(READ "${_kvtier_unit}" _unit)
  string(REPLACE "ExecStart=/usr/bin/kvtierd --config /etc/kvtier/kvtierd.yaml"
         "ExecStart=${CMAKE_INSTALL_PREFIX}/${_kvtier_bindir}/kvtierd --config ${_kvtier_etc}/kvtierd.yaml"
         _installed "${_unit}")
  if(_installed STREQUAL _unit AND NOT CMAKE_INSTALL_PREFIX MATCHES "^/usr/?$")
    message(FATAL_ERROR "${_kvtier_unit}: its ExecStart line is not the one install.cmake rewrites")
  endif()
  file(WRITE "${_kvtier_unit_out}" "${_installed}")
  file(INSTALL DESTINATION "${CMAKE_INSTALL_PREFIX}/lib/systemd/system" TYPE FILE
       FILES "${_kvtier_unit_out}")
]] COMPONENT daemon)
