#!/usr/bin/env bash
# One command: install what is missing, build, and run every test in four
# stages (see docs/testing.md):
#   1. the ctest suite on the normal build (${BUILD_DIR:-build});
#   2. the same suite under ASan + UBSan (scripts/sanitize.sh);
#   3. each libFuzzer target for FUZZ_SECONDS (scripts/fuzz.sh);
#   4. the cpu container image, built from the Dockerfile without a Docker
#      daemon and smoke-tested (scripts/container-smoke.sh).
#   TEMB_TEST_SANITIZE=0 / TEMB_TEST_FUZZ=0 / TEMB_TEST_CONTAINER=0 skip
#   stage 2 / 3 / 4.
# The last line printed is "N passed, N failed", summed over the stages.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh && scripts/build.sh || {
  echo "0 passed, 1 failed"
  exit 1
}

LOG_DIR="$(mktemp -d)"
trap 'rm -rf "$LOG_DIR"' EXIT
passed=0
failed=0
failures=()  # "stage: what failed", repeated at the end where a log tail shows it

# run_stage <name> <command...>: runs the command, showing its output, and
# adds its counts, read from ctest's "NN% tests passed, F tests failed out of
# T" or the fuzz runner's "P passed, F failed".  A stage that fails before
# reporting counts (a build error, a timeout) counts as one failure.
run_stage() {
  local name="$1"
  shift
  local log="$LOG_DIR/$name.log"
  "$@" 2>&1 | tee "$log"
  local rc="${PIPESTATUS[0]}"
  local p=0 f=0 line
  line="$(grep -E '^[0-9]+% tests passed, [0-9]+ tests? failed out of [0-9]+' \
    "$log" | tail -n 1)"
  if [[ -n "$line" ]]; then
    f="$(sed -E 's/.* ([0-9]+) tests? failed out of.*/\1/' <<<"$line")"
    p="$(($(sed -E 's/.* out of ([0-9]+).*/\1/' <<<"$line") - f))"
  else
    line="$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -n 1)"
    if [[ -n "$line" ]]; then
      read -r p _ f _ <<<"$line"
    fi
  fi
  if ((rc != 0 && f == 0)); then
    f=1
  fi
  if ((f > 0)); then
    # ctest's "The following tests FAILED:" list, the fuzz runner's and the
    # container smoke test's FAIL lines; else the stage's last line.
    local what
    what="$(sed -n '/^The following tests FAILED:/,/^Errors while running/p' \
      "$log" | grep -E '^[[:space:]]+[0-9]+ - ' |
      sed -E 's/^[[:space:]]+//')"
    [[ -n "$what" ]] || what="$(grep -E 'FAIL' "$log" | tail -n 20)"
    [[ -n "$what" ]] || what="$(tail -n 1 "$log")"
    while IFS= read -r line; do
      failures+=("$name: $line")
    done <<<"$what"
  fi
  echo "test.sh: stage $name: $p passed, $f failed (exit $rc)"
  passed=$((passed + p))
  failed=$((failed + f))
}

run_stage ctest bash -c 'cd "${BUILD_DIR:-build}" &&
  ctest --output-on-failure --timeout 900 -j "${TEST_JOBS:-2}"'
if [[ "${TEMB_TEST_SANITIZE:-1}" != 0 ]]; then
  run_stage sanitize scripts/sanitize.sh
fi
if [[ "${TEMB_TEST_FUZZ:-1}" != 0 ]]; then
  run_stage fuzz scripts/fuzz.sh
fi
if [[ "${TEMB_TEST_CONTAINER:-1}" != 0 ]]; then
  run_stage container scripts/container-smoke.sh
else
  echo "test.sh: stage container SKIPPED (TEMB_TEST_CONTAINER=0): the image was not built or tested"
fi
for line in "${failures[@]}"; do
  echo "test.sh: FAILED $line"
done
echo "$passed passed, $failed failed"
((failed == 0))
