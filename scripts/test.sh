#!/usr/bin/env bash
# One command: install what is missing, build, and run every test.
# The last line printed is ctest's summary.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure --timeout 900 -j "${TEST_JOBS:-2}"
