# Writes the Python client's gRPC stubs, the package temb._proto, from the
# server's proto/temb/v1/temb.proto.  A script (cmake -P), so that the
# package's build (cmake/TembPythonPackage.cmake) and the tests that import
# client/python from source (tests/pylib/temb_client_suite.py) generate them
# the same way:
#
#   cmake -DPYTHON=<python with grpcio-tools> -DPACKAGE_DIR=<dir holding temb/>
#         [-DVERSION=x.y.z] -P cmake/TembPythonStubs.cmake
#
# VERSION defaults to the `project(temb VERSION ...)` of the CMakeLists.txt
# beside this folder.  PACKAGE_DIR/temb/_proto is replaced as a whole (by a
# rename), so concurrent runs never leave a half-written package behind.
cmake_minimum_required(VERSION 3.25)

foreach(required PYTHON PACKAGE_DIR)
  if(NOT DEFINED ${required})
    message(FATAL_ERROR "TembPythonStubs.cmake: -D${required}=... is required")
  endif()
endforeach()
get_filename_component(_root "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
set(_proto "${_root}/proto/temb/v1/temb.proto")
if(NOT DEFINED VERSION)
  file(STRINGS "${_root}/CMakeLists.txt" _project_line
       REGEX "^project\\(temb VERSION [0-9.]+")
  string(REGEX MATCH "[0-9]+(\\.[0-9]+)*" VERSION "${_project_line}")
endif()
if(NOT VERSION MATCHES "^[0-9]+(\\.[0-9]+)*$")
  message(FATAL_ERROR "TembPythonStubs.cmake: no version (got '${VERSION}')")
endif()

string(RANDOM LENGTH 8 _nonce)
set(_work "${PACKAGE_DIR}/temb/.proto-${_nonce}")
# protoc derives Python import paths from proto import paths: the proto sits
# at temb/_proto/temb/v1/ in a staging tree, so the generated modules import
# each other as temb._proto.temb.v1.*.
set(_stage "${_work}/stage")
set(_out "${_work}/out")
file(MAKE_DIRECTORY "${_stage}/temb/_proto/temb/v1" "${_out}")
file(COPY_FILE "${_proto}" "${_stage}/temb/_proto/temb/v1/temb.proto")
execute_process(
  COMMAND "${PYTHON}" -m grpc_tools.protoc "-I${_stage}"
          "--python_out=${_out}" "--pyi_out=${_out}"
          "--grpc_python_out=${_out}" temb/_proto/temb/v1/temb.proto
  RESULT_VARIABLE _rc ERROR_VARIABLE _error)
if(NOT _rc EQUAL 0)
  file(REMOVE_RECURSE "${_work}")
  message(FATAL_ERROR
    "grpcio-tools failed on ${_proto} (${PYTHON} -m grpc_tools.protoc, "
    "exit ${_rc}): ${_error}")
endif()
set(_package "${_out}/temb/_proto")
file(TOUCH "${_package}/temb/__init__.py" "${_package}/temb/v1/__init__.py")
file(WRITE "${_package}/__init__.py"
  "\"\"\"temb.v1's gRPC stubs, generated from the server's proto by "
  "cmake/TembPythonStubs.cmake; do not edit.\"\"\"\n\n"
  "VERSION = \"${VERSION}\"\n")

set(_target "${PACKAGE_DIR}/temb/_proto")
if(EXISTS "${_target}")
  file(RENAME "${_target}" "${_work}/old")
endif()
file(RENAME "${_package}" "${_target}")
file(REMOVE_RECURSE "${_work}")
