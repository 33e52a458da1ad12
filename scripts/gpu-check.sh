#!/usr/bin/env bash
# The GPU checks, on a GPU machine, from the repository root and a bundle made
# by scripts/gpu-bundle.sh.  Two phases, so that a GPU machine held for a few
# minutes can run them as two runs (or rerun one):
#   tests  the CUDA/CPU parity suite, the auto backend under load and after
#          fork, the server on the GPU (every preset and dtype against the
#          CPU server, routing under 32 clients, a drain with GPU calls in
#          flight) and the CPU engine tests on this CPU; a missing GPU is a
#          failure here, not a skip.  Then Nsight Compute's view of the large
#          fp32 and bf16 kernels, where ncu can read the counters.
#   conditioning
#          the time conditioning's Linears on the GPU (cuBLASLt): the
#          conditioning parity suite with `temb condition --device=cuda`
#          against diffusers' own models (every family, bf16 and fp32,
#          rows batch-invariant), then bench/conditioning_gpu.py at
#          Qwen-Image's real width against diffusers' modules on the same
#          GPU, bit for bit and in time.
#   bench  bench/run.py --gpu --quick: the benchmark report with its CUDA
#          parts.
# Needs python3 with numpy, matplotlib, pytest, grpcio and grpcio-tools, and
# for the conditioning phase PyTorch, safetensors and diffusers.
#   scripts/gpu-check.sh [--phase=tests|conditioning|bench|all] [RESULTS_DIR]
# writes RESULTS_DIR/{gpu-check.log,ncu-*.txt,conditioning-gpu.json,
# benchmarks-gpu.md,bench_results.json} and the report's plots.
set -uo pipefail
cd "$(dirname "$0")/.."
PHASE=all
if [[ "${1:-}" == --phase=* ]]; then
  PHASE="${1#--phase=}"
  shift
fi
BUNDLE="${BUNDLE:-build-gpu-bundle}"
RESULTS="${1:-gpu-results}"
mkdir -p "$RESULTS"
exec > >(tee -a "$RESULTS/gpu-check.log") 2>&1
export LD_LIBRARY_PATH="$PWD/$BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TEMB_TEST_DATA_DIR="$PWD/tests"
export TEMB_BIN_DIR="$PWD/$BUNDLE/bin"
export BENCH_COMMIT="$(cat "$BUNDLE/COMMIT" 2>/dev/null || echo unknown)"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
lscpu | grep -E '^(Model name|CPU\(s\)):'
echo "bundle commit: $BENCH_COMMIT"
failed=()
check() {
  echo "=== $*"
  local started=$SECONDS
  "$@" || failed+=("$*")
  echo "=== $((SECONDS - started)) s"
}

# Nsight Compute's speed-of-light and compute sections for the first launch
# of one kernel instantiation in the CUDA kernel benchmark.  Informational:
# ncu cannot read the counters on every machine.
profile_kernel() {
  local name="$1" regex="$2"
  command -v ncu >/dev/null || { echo "ncu: not installed"; return 0; }
  timeout 180 ncu --clock-control none --kernel-name-base demangled \
    --kernel-name "regex:$regex" \
    --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis --section Occupancy \
    --section LaunchStats --section InstructionStats \
    "$BUNDLE/bin/temb_cuda_kernel_benchmark" >"$RESULTS/ncu-$name.txt" 2>&1 ||
    echo "ncu $name: exit $? (see ncu-$name.txt)"
  grep -E 'Throughput|Duration|Registers|Achieved Occupancy|Executed Ipc' \
    "$RESULTS/ncu-$name.txt" | head -20
}

if [[ "$PHASE" == tests || "$PHASE" == all ]]; then
  export TEMB_REQUIRE_CUDA=1
  check "$BUNDLE/bin/temb_parity_test" --gtest_brief=1
  check "$BUNDLE/bin/temb_auto_backend_gpu_test"
  check "$BUNDLE/bin/temb_registry_fallback_test" --gtest_brief=1
  check "$BUNDLE/bin/temb_gpu_linear_test" --gtest_brief=1
  check "$BUNDLE/bin/temb_cpu_backend_test" --gtest_brief=1
  check "$BUNDLE/bin/temb_golden_test" --gtest_brief=1
  check python3 -m pytest -q -p no:cacheprovider -rs -s tests/e2e/test_gpu.py
  unset TEMB_REQUIRE_CUDA
  profile_kernel fp32 'SinusoidKernel<.*Fp32Out, float'
  profile_kernel bf16 'SinusoidKernel<.*Bf16Out, float'
fi

if [[ "$PHASE" == conditioning || "$PHASE" == all ]]; then
  check env TEMB_CONDITIONING_DEVICE=cuda TEMB_CLI_BIN="$BUNDLE/bin/temb" \
    python3 -m pytest -q -p no:cacheprovider -rs \
    --confcutdir=tests/models/conditioning \
    tests/models/conditioning/test_conditioning_parity.py
  check python3 bench/conditioning_gpu.py --temb "$BUNDLE/bin/temb" \
    --json "$RESULTS/conditioning-gpu.json"
fi

if [[ "$PHASE" == bench || "$PHASE" == all ]]; then
  check python3 bench/run.py --no-build --gpu --quick --build-dir="$BUNDLE" \
    --output="$RESULTS/benchmarks-gpu.md"
  cp "$BUNDLE/bench_results.json" "$RESULTS/" 2>/dev/null
fi

if ((${#failed[@]})); then
  echo "FAILED: ${failed[*]}"
  exit 1
fi
echo "all GPU checks passed ($PHASE)"
