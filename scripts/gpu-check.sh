#!/usr/bin/env bash
# The GPU checks, on a GPU machine, from the repository root and a bundle made
# by scripts/gpu-bundle.sh: the CUDA/CPU parity suite (a missing GPU is a
# failure here, not a skip), the CPU engine tests on this CPU, and the
# benchmark suite with its CUDA parts.  Needs python3 with numpy, matplotlib,
# grpcio and grpcio-tools (PyTorch is used when present).
#   scripts/gpu-check.sh [RESULTS_DIR]      (default: gpu-results)
# writes RESULTS_DIR/benchmarks-gpu.md, its plots and bench_results.json.
set -uo pipefail
cd "$(dirname "$0")/.."
BUNDLE="${BUNDLE:-build-gpu-bundle}"
RESULTS="${1:-gpu-results}"
mkdir -p "$RESULTS"
export LD_LIBRARY_PATH="$PWD/$BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TEMB_TEST_DATA_DIR="$PWD/tests"
export BENCH_COMMIT="$(cat "$BUNDLE/COMMIT" 2>/dev/null || echo unknown)"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
lscpu | grep -E '^(Model name|CPU\(s\)):'
failed=()
check() {
  echo "=== $*"
  "$@" || failed+=("$1")
}
TEMB_REQUIRE_CUDA=1 check "$BUNDLE/bin/temb_parity_test"
check "$BUNDLE/bin/temb_cpu_backend_test"
check "$BUNDLE/bin/temb_golden_test"
check python3 bench/run.py --no-build --gpu --quick --build-dir="$BUNDLE" \
  --output="$RESULTS/benchmarks-gpu.md"
cp "$BUNDLE/bench_results.json" "$RESULTS/" 2>/dev/null
if ((${#failed[@]})); then
  echo "FAILED: ${failed[*]}"
  exit 1
fi
echo "all GPU checks passed"
