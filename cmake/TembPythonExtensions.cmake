# Whether the Python client's native extensions are built (client/local:
# temb.local's engine; client/transport: temb.Client's C++ calls), and
# pybind11 for them.  Built for the interpreter ${TEMB_PYTHON}, into
# <build>/python/, where the Python client finds them (see
# client/python/README.md).  Sets TEMB_PYTHON_EXTENSIONS (ON/OFF).
#
# TEMB_BUILD_PYTHON_EXTENSION: ON, OFF or AUTO (the default: ON when
# ${TEMB_PYTHON} can import pybind11 (scripts/requirements-dev.txt) and the
# build is not sanitized, whose libraries a plain interpreter cannot load).
# AUTO is decided again at every configure, so installing pybind11 later is
# enough.
set(TEMB_PYTHON_EXTENSIONS OFF)

# The package's build backend names the interpreter the wheel is for, and
# has pybind11 among its build requirements.
if(TEMB_PYTHON_PACKAGE)
  if(NOT Python_EXECUTABLE)
    message(FATAL_ERROR "TEMB_PYTHON_PACKAGE needs Python_EXECUTABLE "
                        "(scikit-build-core sets it: pip install ./client/python)")
  endif()
  set(TEMB_PYTHON "${Python_EXECUTABLE}" CACHE FILEPATH "" FORCE)
  set(TEMB_BUILD_PYTHON_EXTENSION ON CACHE STRING "" FORCE)
endif()

# The same cache entry as tests/CMakeLists.txt (configured after this one).
set(TEMB_PYTHON "${CMAKE_SOURCE_DIR}/.venv/bin/python" CACHE FILEPATH
    "Python interpreter with the test requirements (scripts/install-deps.sh)")
set(TEMB_BUILD_PYTHON_EXTENSION AUTO CACHE STRING
    "Build the Python client's native extensions: ON, OFF or AUTO (ON when TEMB_PYTHON imports pybind11)")
set_property(CACHE TEMB_BUILD_PYTHON_EXTENSION PROPERTY STRINGS AUTO ON OFF)

set(_temb_ext_why "")
set(_pybind11_dir "")
if(NOT EXISTS "${TEMB_PYTHON}")
  set(_temb_ext_why "TEMB_PYTHON (${TEMB_PYTHON}) does not exist")
else()
  execute_process(
    COMMAND "${TEMB_PYTHON}" -c "import pybind11; print(pybind11.get_cmake_dir())"
    OUTPUT_VARIABLE _pybind11_dir OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE _pybind11_rc ERROR_QUIET)
  if(NOT _pybind11_rc EQUAL 0)
    set(_pybind11_dir "")
    set(_temb_ext_why "${TEMB_PYTHON} cannot import pybind11 (pip install -r scripts/requirements-dev.txt)")
  endif()
endif()

string(TOUPPER "${TEMB_BUILD_PYTHON_EXTENSION}" _temb_ext_choice)
if(_temb_ext_choice STREQUAL "AUTO")
  if(TEMB_SANITIZE AND NOT _temb_ext_why)
    set(_temb_ext_why "sanitized builds cannot be loaded by a plain interpreter")
  endif()
  if(_temb_ext_why)
    message(STATUS "Python extensions: OFF (${_temb_ext_why}); "
                   "-DTEMB_BUILD_PYTHON_EXTENSION=ON insists")
    return()
  endif()
elseif(NOT _temb_ext_choice)  # OFF, FALSE, 0, ...
  message(STATUS "Python extensions: OFF (TEMB_BUILD_PYTHON_EXTENSION)")
  return()
elseif(_temb_ext_why)
  message(FATAL_ERROR "TEMB_BUILD_PYTHON_EXTENSION=ON, but ${_temb_ext_why}")
endif()

set(Python_EXECUTABLE "${TEMB_PYTHON}")
find_package(Python REQUIRED COMPONENTS Interpreter Development.Module)
set(PYBIND11_FINDPYTHON ON)
find_package(pybind11 CONFIG REQUIRED HINTS "${_pybind11_dir}" NO_DEFAULT_PATH)
message(STATUS "Python extensions: ON (pybind11 ${pybind11_VERSION}, "
               "Python ${Python_VERSION})")
set(TEMB_PYTHON_EXTENSIONS ON)
