# The Python package's build (TEMB_PYTHON_PACKAGE=ON, set by client/python's
# pyproject.toml through scikit-build-core): the same targets as the server
# build, reduced to what `pip install ./client/python` ships in the package
# `temb`:
#   _temb_local      temb.local's engine (client/local): base, kernels (CPU),
#                    the service core, the conditioning models (checkpoint
#                    reader, families, row cache) and their temb.v1
#                    conversions;
#   _temb_transport  temb.Client's native transport (client/transport), only
#                    where gRPC's C++ development files are found;
#   _proto/          temb.v1's Python stubs, from proto/temb/v1/temb.proto;
#   _build.py        the version and why the native transport is missing.
# No server, CLI, tests, benchmarks or CUDA.
#
# TEMB_NATIVE_TRANSPORT: AUTO (the default: built where pkg-config finds
# grpc++), ON (an error without it) or OFF.  pkg-config rather than
# gRPCConfig.cmake: Debian's aborts the configure whenever the gRPC
# compiler plugins (protobuf-compiler-grpc) are missing, which the package
# does not need.
#
# Included from the top-level CMakeLists.txt where the server build finds
# gRPC; the rules that need the package's targets run at the end of the
# configure (cmake_language(DEFER)).

# pip shows a build's output only with -v: a user would see minutes of
# "Building wheel ... running".  So each compile and link of the package
# names itself on the terminal, with its place among the build's steps
# (cmake/temb_build_progress.sh, ahead of ccache where there is one; it
# writes nothing without a terminal).  The steps are counted when the
# configure ends (_temb_python_package_contents).
set(_temb_progress_dir "${CMAKE_BINARY_DIR}/temb_progress")
file(MAKE_DIRECTORY "${_temb_progress_dir}")
file(WRITE "${_temb_progress_dir}/done" "0\n")
# Run by sh: an sdist need not keep the script's executable bit.
set(_temb_progress sh "${CMAKE_CURRENT_LIST_DIR}/temb_build_progress.sh"
    "${_temb_progress_dir}")
foreach(lang C CXX)
  set(CMAKE_${lang}_COMPILER_LAUNCHER ${_temb_progress})
  if(CCACHE_PROGRAM)
    list(APPEND CMAKE_${lang}_COMPILER_LAUNCHER "${CCACHE_PROGRAM}")
  endif()
  set(CMAKE_${lang}_LINKER_LAUNCHER ${_temb_progress})
endforeach()

# The steps the launcher shows: every C and C++ source of every target in
# the build, and every link of a module, shared library or executable.
function(_temb_count_build_steps directory count_var)
  set(count ${${count_var}})
  get_property(targets DIRECTORY "${directory}" PROPERTY BUILDSYSTEM_TARGETS)
  foreach(target IN LISTS targets)
    get_target_property(type ${target} TYPE)
    if(type STREQUAL "INTERFACE_LIBRARY" OR type STREQUAL "UTILITY")
      continue()
    endif()
    get_target_property(sources ${target} SOURCES)
    foreach(source IN LISTS sources)
      if(source MATCHES "\\.(c|cc|cpp)$")
        math(EXPR count "${count} + 1")
      endif()
    endforeach()
    if(NOT type STREQUAL "STATIC_LIBRARY" AND NOT type STREQUAL "OBJECT_LIBRARY")
      math(EXPR count "${count} + 1")
    endif()
  endforeach()
  get_property(children DIRECTORY "${directory}" PROPERTY SUBDIRECTORIES)
  foreach(child IN LISTS children)
    _temb_count_build_steps("${child}" count)
  endforeach()
  set(${count_var} ${count} PARENT_SCOPE)
endfunction()

set(TEMB_NATIVE_TRANSPORT AUTO CACHE STRING
    "Build the Python package's native transport: AUTO, ON or OFF")
set_property(CACHE TEMB_NATIVE_TRANSPORT PROPERTY STRINGS AUTO ON OFF)
# What installs gRPC's C++ development files, for the messages below.
set(_temb_grpc_packages "libgrpc++-dev (Debian/Ubuntu)")

set(TEMB_PYTHON_TRANSPORT OFF)
set(TEMB_PYTHON_TRANSPORT_MISSING "")
string(TOUPPER "${TEMB_NATIVE_TRANSPORT}" _temb_transport_choice)
if(_temb_transport_choice STREQUAL "AUTO" OR _temb_transport_choice)
  find_package(PkgConfig REQUIRED)
  pkg_check_modules(TEMB_GRPCPP QUIET IMPORTED_TARGET GLOBAL grpc++)
  if(TEMB_GRPCPP_FOUND)
    # client/transport links gRPC::grpc++, as in the server build.
    add_library(gRPC::grpc++ ALIAS PkgConfig::TEMB_GRPCPP)
    set(TEMB_PYTHON_TRANSPORT ON)
  else()
    string(CONCAT TEMB_PYTHON_TRANSPORT_MISSING
           "gRPC's C++ development files were not found when the package "
           "was built (pkg-config grpc++); install ${_temb_grpc_packages} "
           "and reinstall temb to get it")
    if(NOT _temb_transport_choice STREQUAL "AUTO")
      message(FATAL_ERROR "TEMB_NATIVE_TRANSPORT=ON, but "
                          "${TEMB_PYTHON_TRANSPORT_MISSING}")
    endif()
  endif()
else()
  set(TEMB_PYTHON_TRANSPORT_MISSING
      "the package was built with TEMB_NATIVE_TRANSPORT=OFF")
endif()

if(TEMB_PYTHON_TRANSPORT)
  message(STATUS "temb Python package: native transport ON "
                 "(gRPC ${TEMB_GRPCPP_VERSION})")
else()
  # The line a `pip install -v` shows: what temb.Client loses and the
  # packages that bring it back.
  message(WARNING "temb Python package: no native transport: "
                  "${TEMB_PYTHON_TRANSPORT_MISSING}.  temb.Client will make "
                  "its calls through grpcio (about 2x the C++ client's "
                  "latency at batch 1); temb.local is unaffected.")
endif()

function(_temb_python_package_contents)
  if(NOT TARGET temb_local_ext)
    message(FATAL_ERROR "TEMB_PYTHON_PACKAGE: the extension target "
                        "temb_local_ext was not defined (client/local)")
  endif()
  set(extensions temb_local_ext)
  if(TEMB_PYTHON_TRANSPORT)
    list(APPEND extensions temb_transport_ext)
  endif()
  install(TARGETS ${extensions} LIBRARY DESTINATION temb)

  set(stubs_root "${CMAKE_BINARY_DIR}/python_package")
  set(stubs_stamp "${stubs_root}/temb/_proto/__init__.py")
  add_custom_command(OUTPUT "${stubs_stamp}"
    COMMAND "${CMAKE_COMMAND}" "-DPYTHON=${Python_EXECUTABLE}"
            "-DPACKAGE_DIR=${stubs_root}" "-DVERSION=${PROJECT_VERSION}"
            -P "${PROJECT_SOURCE_DIR}/cmake/TembPythonStubs.cmake"
    DEPENDS "${PROJECT_SOURCE_DIR}/proto/temb/v1/temb.proto"
            "${PROJECT_SOURCE_DIR}/cmake/TembPythonStubs.cmake"
    COMMENT "Generating temb._proto from proto/temb/v1/temb.proto")
  add_custom_target(temb_python_stubs ALL DEPENDS "${stubs_stamp}")
  install(DIRECTORY "${stubs_root}/temb/_proto" DESTINATION temb)

  if(TEMB_PYTHON_TRANSPORT_MISSING)
    set(missing "\"${TEMB_PYTHON_TRANSPORT_MISSING}\"")
  else()
    set(missing None)
  endif()
  file(CONFIGURE OUTPUT "${stubs_root}/temb/_build.py" CONTENT
"\"\"\"How this installed package was built (written by its CMake build,
cmake/TembPythonPackage.cmake; absent when temb runs from a checkout).\"\"\"

VERSION = \"@PROJECT_VERSION@\"
# Why the native transport (_temb_transport) is not in the package, or None.
NATIVE_TRANSPORT_MISSING = @missing@
" @ONLY)
  install(FILES "${stubs_root}/temb/_build.py" DESTINATION temb)

  set(steps 0)
  _temb_count_build_steps("${CMAKE_SOURCE_DIR}" steps)
  file(WRITE "${_temb_progress_dir}/steps" "${steps}\n")
  message(STATUS "temb Python package: ${steps} build steps")
endfunction()
cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}"
               CALL _temb_python_package_contents)
