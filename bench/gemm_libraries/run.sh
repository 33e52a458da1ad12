#!/usr/bin/env bash
# Builds bench/gemm_libraries/gemm_libraries.cc once per library Debian 12
# ships (apt-get install libopenblas-dev libblis-dev libdnnl-dev) against
# temb's kernels from BUILD (default build/), and runs each.  The libraries
# are measured here only: temb does not depend on them.
#   bench/gemm_libraries/run.sh [BUILD] [RUNS]
set -euo pipefail
cd "$(dirname "$0")/../.."
build="${1:-build}"
runs="${2:-7}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
common=(-std=c++17 -O2 -fopenmp -Ikernels/cpu/include -Ikernels/include
        -I"$build/kernels/include" bench/gemm_libraries/gemm_libraries.cc
        "$build/kernels/cpu/libtemb_kernels_cpu.a"
        "$build/kernels/libtemb_kernels_api.a")
absl=$(pkg-config --libs absl_status absl_statusor absl_strings sleef)
declare -A flags=(
  [openblas]="-DTEMB_GEMM_OPENBLAS -I/usr/include/x86_64-linux-gnu/openblas-pthread -lopenblas"
  [blis]="-DTEMB_GEMM_BLIS -L/usr/lib/x86_64-linux-gnu/blis-openmp -lblis"
  [dnnl]="-DTEMB_GEMM_DNNL -ldnnl")
for lib in openblas blis dnnl; do
  # shellcheck disable=SC2086
  g++ "${common[@]}" ${flags[$lib]} $absl -o "$out/$lib"
  echo "== $lib"
  "$out/$lib" "$runs"
done
