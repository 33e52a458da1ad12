#!/usr/bin/env bash
# Builds temb with AddressSanitizer + UndefinedBehaviorSanitizer (g++,
# -DTEMB_SANITIZE=ON) into ${SANITIZE_BUILD_DIR:-build-asan} and runs the
# whole ctest suite against those binaries: the C++ tests directly, and the
# Python/end-to-end tests through the instrumented temb-server and temb CLI
# they start.  Any report stops the process (halt_on_error) and fails the
# test that ran it.  Extra arguments go to ctest (e.g. -L unit).
#
# The CUDA backend is left out: ASan's shadow memory and the CUDA driver do
# not mix, and no GPU runs here anyway.  Benchmarks are left out: they are
# not tests.  The suites labelled `parity` (numbers against diffusers' own
# run: the conditioning parity, offload and preset suites) are left out too:
# the main stage runs them, and under the sanitizers the served and
# recorded-bytes suites, the C++ tests and the fuzzers take the same server
# paths (see docs/testing.md).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${SANITIZE_BUILD_DIR:-build-asan}"

cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DTEMB_SANITIZE=ON -DTEMB_ENABLE_CUDA=OFF -DTEMB_BUILD_BENCHMARKS=OFF \
  -DTEMB_PYTHON="$PWD/.venv/bin/python"
cmake --build "$BUILD_DIR" --parallel "${JOBS:-$(nproc)}"

# Inherited by every process the tests start.  Leak checking stays on: a
# server that leaks on shutdown fails its test.
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:check_initialization_order=1:strict_init_order=1:detect_stack_use_after_return=1:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:${UBSAN_OPTIONS:-}"

cd "$BUILD_DIR"
# The soak runs for 30 s here: long enough for ASan's leak checker and for
# races to show, without repeating the main stage's two-minute run.
# python_client_install is left out: it checks pip packaging of pure Python
# (already run in the main stage), not native code.
export TEMB_SOAK_SECONDS="${TEMB_SOAK_SECONDS:-30}"
timeout "${SANITIZE_TIMEOUT:-2400}" \
  ctest --output-on-failure --timeout 900 -j "${TEST_JOBS:-2}" \
  -E '^python_client_install$' -LE '^parity$' "$@"
