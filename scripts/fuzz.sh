#!/usr/bin/env bash
# Builds the libFuzzer targets in fuzz/ with clang++-14, ASan and UBSan into
# ${FUZZ_BUILD_DIR:-build-fuzz} and runs each one for FUZZ_SECONDS (default
# 60) from its seed corpus.  Any crash, failed invariant, sanitizer report,
# leak, slow input (FUZZ_INPUT_TIMEOUT seconds) or memory blow-up is a
# failure; the reproducer is written to <build>/fuzz/findings/<target>/ and
# can be replayed with `<build>/bin/fuzz_<target> <file>`.
#   FUZZ_TARGETS="kernel_api native_request"   run only these
# New inputs found along the way accumulate in <build>/fuzz/work/<target>/,
# so repeated local runs start where the last one stopped.
#   FUZZ_JOBS=1                                 one target at a time
# (default: one per core).
# The last line printed is "N passed, N failed" (one per target).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${FUZZ_BUILD_DIR:-build-fuzz}"
SECONDS_EACH="${FUZZ_SECONDS:-60}"
read -r -a TARGETS <<<"${FUZZ_TARGETS:-native_request kserve_infer kernel_api rest_request safetensors_header model_folder}"

# Debian's gRPC and protobuf are built with g++ against libstdc++, which
# clang uses too, so the clang build links against them unchanged.
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
  -DTEMB_BUILD_FUZZERS=ON -DTEMB_SANITIZE=ON -DTEMB_ENABLE_CUDA=OFF \
  -DTEMB_BUILD_TESTS=OFF -DTEMB_BUILD_BENCHMARKS=OFF
cmake --build "$BUILD_DIR" --parallel "${JOBS:-$(nproc)}" \
  --target "${TARGETS[@]/#/fuzz_}"

export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:${UBSAN_OPTIONS:-}"
if symbolizer="$(command -v llvm-symbolizer-14)"; then
  export ASAN_SYMBOLIZER_PATH="$symbolizer"
fi
# One target per core at a time: each is one process, and the stage's time
# is then its targets' seconds divided by the cores.
fuzz_one() {
  local target="$1"
  local work="$BUILD_DIR/fuzz/work/$target"
  local findings="$BUILD_DIR/fuzz/findings/$target"
  mkdir -p "$work" "$findings"
  echo "fuzz.sh: running fuzz_$target for ${SECONDS_EACH}s"
  if timeout --kill-after=30 "$((SECONDS_EACH + 120))" \
      "$BUILD_DIR/bin/fuzz_$target" \
      -max_total_time="$SECONDS_EACH" \
      -timeout="${FUZZ_INPUT_TIMEOUT:-10}" \
      -rss_limit_mb=2560 \
      -print_final_stats=1 \
      -artifact_prefix="$findings/" \
      "$work" "$BUILD_DIR/fuzz/corpus/$target" \
      >"$BUILD_DIR/fuzz/$target.log" 2>&1; then
    tail -n 20 "$BUILD_DIR/fuzz/$target.log"
    echo "fuzz.sh: fuzz_$target: no findings"
    return 0
  fi
  tail -n 60 "$BUILD_DIR/fuzz/$target.log" >&2
  echo "fuzz.sh: fuzz_$target FAILED; reproducer(s) in $findings:" >&2
  ls -l "$findings" >&2 || true
  return 1
}

JOBS_AT_ONCE="${FUZZ_JOBS:-$(nproc)}"
passed=0
failed=0
pids=()
names=()
settle() {  # waits for the oldest running target and counts it
  if wait "${pids[0]}"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
  fi
  pids=("${pids[@]:1}")
  names=("${names[@]:1}")
}
for target in "${TARGETS[@]}"; do
  if ((${#pids[@]} >= JOBS_AT_ONCE)); then settle; fi
  fuzz_one "$target" &
  pids+=("$!")
  names+=("$target")
done
while ((${#pids[@]} > 0)); do settle; done
echo "$passed passed, $failed failed"
((failed == 0))
