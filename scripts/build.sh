#!/usr/bin/env bash
# Configures and builds temb into ${BUILD_DIR:-build}.  Extra arguments go to
# CMake's configure step (e.g. -DTEMB_ENABLE_CUDA=OFF).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${BUILD_DIR:-build}"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" \
  -DTEMB_PYTHON="$PWD/.venv/bin/python" "$@"
cmake --build "$BUILD_DIR" --parallel "${JOBS:-$(nproc)}"
