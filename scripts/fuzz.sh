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
passed=0
failed=0
for target in "${TARGETS[@]}"; do
  work="$BUILD_DIR/fuzz/work/$target"
  findings="$BUILD_DIR/fuzz/findings/$target"
  mkdir -p "$work" "$findings"
  echo "fuzz.sh: running fuzz_$target for ${SECONDS_EACH}s"
  # libFuzzer writes new inputs into the first directory and only reads the
  # seeds; the outer timeout is a backstop should the fuzzer hang on exit.
  if timeout --kill-after=30 "$((SECONDS_EACH + 120))" \
      "$BUILD_DIR/bin/fuzz_$target" \
      -max_total_time="$SECONDS_EACH" \
      -timeout="${FUZZ_INPUT_TIMEOUT:-10}" \
      -rss_limit_mb=2560 \
      -print_final_stats=1 \
      -artifact_prefix="$findings/" \
      "$work" "$BUILD_DIR/fuzz/corpus/$target"; then
    echo "fuzz.sh: fuzz_$target: no findings"
    passed=$((passed + 1))
  else
    echo "fuzz.sh: fuzz_$target FAILED; reproducer(s) in $findings:" >&2
    ls -l "$findings" >&2 || true
    failed=$((failed + 1))
  fi
done
echo "$passed passed, $failed failed"
((failed == 0))
