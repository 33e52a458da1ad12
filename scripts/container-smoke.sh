#!/usr/bin/env bash
# Builds the cpu image from the Dockerfile and smoke-tests it, with no Docker
# daemon and no registry (docs/testing.md, docs/deploy.md):
#   1. base: a Debian 12 root filesystem from the Debian mirror this machine
#      uses (mmdebstrap), imported as localhost/debian:bookworm; kept and
#      reused on later runs (TEMB_CONTAINER_FRESH_BASE=1 makes it again);
#   2. build: `buildah bud --target cpu`, tagged localhost/temb:<version>-cpu
#      (the name and tag deploy/ refers to), and `--target front`, the nginx
#      front, tagged localhost/temb:<version>-front;
#   3. smoke: the image's config (non-root user, HEALTHCHECK, ports), its size
#      against the budget, and two containers: one with the image's defaults
#      and no network (its own HEALTHCHECK must report SERVING, the server
#      runs as uid 10001), one on the host network called from a client
#      container; embeddings from the server equal `temb embed --local` byte
#      for byte; SIGTERM drains both and they exit 0; then a pod as
#      deploy/base lays it out: temb-server on loopback serving a tiny
#      conditioning model (made on the host with diffusers, mounted
#      read-only), the front image in its network namespace; KServe gRPC and
#      REST through the front answer the bytes of `temb condition` run in the
#      image.
# Prints each check, the phase times and "N passed, N failed" last.  Needs
# root and buildah, podman, runc, mmdebstrap (scripts/install-deps.sh).  A
# machine whose kernel forbids containers fails loudly: skip the stage on
# purpose with TEMB_TEST_CONTAINER=0 (scripts/test.sh).
#
# Environment:
#   TEMB_IMAGE              image to build (default localhost/temb:<version>-cpu)
#   TEMB_IMAGE_BUDGET_MB    size budget in MB, 10^6 bytes (default 200)
#   TEMB_FRONT_IMAGE        front image to build (default localhost/temb:<version>-front)
#   TEMB_FRONT_IMAGE_BUDGET_MB  its size budget in MB (default 120)
#   TEMB_PYTHON             Python with torch, diffusers and tritonclient
#                           (default .venv/bin/python)
#   TEMB_CONTAINER_JOBS     compile jobs inside the build (default 2)
#   TEMB_CONTAINER_STORAGE  containers/storage root (default /var/lib/containers/temb)
#   TEMB_CONTAINER_RUNROOT  its run directory (default /run/containers/temb)
#   TEMB_CONTAINER_DIR      work directory for the root filesystem and logs
#                           (default /var/tmp/temb-container)
#   TEMB_CONTAINER_FRESH_BASE=1  rebuild the Debian base image
#   TEMB_CA_BUNDLE          CA bundle the build trusts for HTTPS (default
#                           /etc/ssl/certs/ca-certificates.crt)
#   TEMB_BUILD_LOCK         a file to flock around the image build (shared
#                           machines: serialise compiles with other users)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

VERSION="$(sed -nE 's/^project\(temb VERSION ([0-9.]+).*/\1/p' CMakeLists.txt)"
IMAGE="${TEMB_IMAGE:-localhost/temb:${VERSION}-cpu}"
BASE_IMAGE="localhost/debian:bookworm"
BUDGET_MB="${TEMB_IMAGE_BUDGET_MB:-200}"
FRONT_IMAGE="${TEMB_FRONT_IMAGE:-localhost/temb:${VERSION}-front}"
FRONT_BUDGET_MB="${TEMB_FRONT_IMAGE_BUDGET_MB:-120}"
PYTHON="${TEMB_PYTHON:-.venv/bin/python}"
JOBS="${TEMB_CONTAINER_JOBS:-2}"
WORK_DIR="${TEMB_CONTAINER_DIR:-/var/tmp/temb-container}"
STORAGE="${TEMB_CONTAINER_STORAGE:-/var/lib/containers/temb}"
RUNROOT="${TEMB_CONTAINER_RUNROOT:-/run/containers/temb}"
# vfs: works on every kernel and filesystem (no overlay mounts); chroot
# isolation: no user namespaces or network setup during the build.
STORAGE_OPTS=(--root "$STORAGE" --runroot "$RUNROOT" --storage-driver vfs)
BUILDAH=(buildah "${STORAGE_OPTS[@]}")
# runc, not crun; cgroupfs and file events: no systemd in CI machines.
PODMAN=(podman "${STORAGE_OPTS[@]}" --runtime runc --cgroup-manager cgroupfs
  --events-backend file)
# The ulimits are ones the host grants (podman's defaults exceed them on some
# machines).  No healthcheck timer: podman makes those with systemd, which CI
# machines lack; the checks below run the image's HEALTHCHECK themselves.
RUN_OPTS=(--ulimit nofile=20000:20000 --ulimit nproc=32768:32768
  --health-interval disable)

passed=0
failed=0
containers=()
SCRATCH="$(mktemp -d)"
# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() {
  local c
  for c in "${containers[@]}"; do
    "${PODMAN[@]}" rm -f -t 0 "$c" >/dev/null 2>&1
  done
  rm -rf "$SCRATCH"
}
trap cleanup EXIT
trap 'exit 143' INT TERM

say() { echo "container-smoke: $*"; }
pass() {
  say "PASS $1"
  passed=$((passed + 1))
}
fail() {
  say "FAIL $1"
  shift
  local line
  for line in "$@"; do echo "    $line"; done
  failed=$((failed + 1))
}
finish() {
  say "times: base ${t_base:-0} s, build ${t_build:-0} s, smoke ${t_smoke:-0} s"
  echo "$passed passed, $failed failed"
  ((failed == 0))
  exit
}
# Stops everything: containers cannot be built or run on this machine.
cannot() {
  echo "######################################################################"
  echo "container-smoke: CONTAINERS CANNOT RUN ON THIS MACHINE"
  echo "  $1"
  echo "The image was NOT built or tested; this counts as a failure."
  echo "To skip the container stage on purpose: TEMB_TEST_CONTAINER=0."
  echo "######################################################################"
  fail "containers work on this machine" "$1"
  finish
}

# ---- preflight ---------------------------------------------------------------

if [[ $(id -u) -ne 0 ]]; then
  cannot "must run as root (daemonless buildah/podman with the vfs driver)"
fi
missing=()
for tool in buildah podman runc conmon mmdebstrap; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
if ((${#missing[@]})); then
  cannot "missing ${missing[*]}: run scripts/install-deps.sh"
fi
if ! out="$(unshare --fork --pid --mount --uts --ipc --net --mount-proc true 2>&1)"; then
  cannot "the kernel refuses new namespaces (unshare: ${out:-failed})"
fi
mkdir -p "$WORK_DIR" || cannot "cannot create $WORK_DIR"
# One run at a time per machine: they share the base image, its root
# filesystem and the image tag.
exec 9>"$WORK_DIR/lock"
if ! flock -n 9; then
  say "waiting for another container-smoke run on this machine"
  flock 9
fi

# ---- 1. base image -------------------------------------------------------------

# The Debian sources this machine's apt uses (the bookworm, -updates and
# -security entries, deb822 or one-line), so that the image is bootstrapped
# from the same mirror, proxy or snapshot.
debian_sources_deb822() {
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f $f ]] || continue
    awk 'BEGIN { RS = ""; ORS = "\n\n" }
         /(^|\n)Suites:[^\n]*[[:space:]]bookworm(-updates|-security)?([[:space:]]|$)/ &&
         /(^|\n)Types:[^\n]*deb([[:space:]]|$)/' "$f"
  done
}
debian_sources_list() {
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -f $f ]] || continue
    grep -E '^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?[^[:space:]]+[[:space:]]+bookworm(-updates|-security)?[[:space:]]' "$f"
  done
}

t0=$SECONDS
if [[ "${TEMB_CONTAINER_FRESH_BASE:-0}" == 1 ]] ||
  ! "${PODMAN[@]}" image exists "$BASE_IMAGE" 2>/dev/null; then
  debian_sources_deb822 >"$WORK_DIR/debian.sources"
  debian_sources_list >"$WORK_DIR/debian.list"
  sources=()
  for f in "$WORK_DIR/debian.sources" "$WORK_DIR/debian.list"; do
    [[ -s $f ]] && sources+=("$f")
  done
  if ((${#sources[@]} == 0)); then
    fail "base image" "no Debian bookworm source in /etc/apt/sources.list{,.d}"
    finish
  fi
  say "bootstrapping $BASE_IMAGE from $(grep -hoE '^(URIs:|deb( \[[^]]*\])?) +[^ ]+' \
    "${sources[@]}" | awk '{print $NF}' | tr '\n' ' ')"
  # merged-usr hook: /bin -> usr/bin links made directly (else apt installs
  # usrmerge and perl).  docker-clean (as in Debian's official images):
  # apt keeps no .deb files or package caches in image layers.  No manuals,
  # info pages, translations or documentation (copyrights kept).
  rm -f "$WORK_DIR/rootfs.tar"
  # shellcheck disable=SC2016  # $1 is expanded by mmdebstrap's hook shell
  if ! nice -n 19 mmdebstrap --variant=apt --format=tar \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --customize-hook='cat > "$1/etc/apt/apt.conf.d/docker-clean" <<EOF
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
echo "Acquire::Languages \"none\";" > "$1/etc/apt/apt.conf.d/docker-no-languages"
rm -f "$1"/var/cache/apt/*.bin' \
    bookworm "$WORK_DIR/rootfs.tar" "${sources[@]}" >"$WORK_DIR/mmdebstrap.log" 2>&1; then
    tail -n 30 "$WORK_DIR/mmdebstrap.log"
    fail "base image" "mmdebstrap failed (log: $WORK_DIR/mmdebstrap.log)"
    finish
  fi
  "${PODMAN[@]}" rmi -f "$BASE_IMAGE" >/dev/null 2>&1
  if ! "${PODMAN[@]}" import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["bash"]' "$WORK_DIR/rootfs.tar" "$BASE_IMAGE" >/dev/null 2>&1; then
    fail "base image" "podman import of $WORK_DIR/rootfs.tar failed"
    finish
  fi
  say "base image $BASE_IMAGE: rootfs $(($(stat -c %s "$WORK_DIR/rootfs.tar") / 1000000)) MB"
else
  say "reusing $BASE_IMAGE (TEMB_CONTAINER_FRESH_BASE=1 rebuilds it)"
fi
t_base=$((SECONDS - t0))

# Can this kernel run a container at all?  Seconds, before a long build.
if ! out="$("${PODMAN[@]}" run --rm --network none "${RUN_OPTS[@]}" \
  "$BASE_IMAGE" true 2>&1)"; then
  cannot "podman run of $BASE_IMAGE failed: $out"
fi
pass "base image $BASE_IMAGE runs a container"

# ---- 2. build ------------------------------------------------------------------

build_log="$WORK_DIR/build.log"
if [[ -n "${TEMB_BUILD_LOCK:-}" ]]; then
  t0=$SECONDS
  exec 8>>"$TEMB_BUILD_LOCK"
  flock 8
  say "waited $((SECONDS - t0)) s for $TEMB_BUILD_LOCK"
fi
t0=$SECONDS
# This machine's CA bundle, for HTTPS downloads in the build (PyPI's CMake)
# through a TLS-inspecting proxy that this machine trusts.
secrets=()
ca_bundle="${TEMB_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
if [[ -s $ca_bundle ]]; then
  secrets=(--secret "id=ca-certificates,src=$ca_bundle")
fi
say "building $IMAGE (--target cpu, -j$JOBS; log: $build_log)"
if nice -n 19 "${BUILDAH[@]}" bud --isolation chroot --pull=never \
  --format docker --layers=false --force-rm --target cpu "${secrets[@]}" \
  --build-arg "DEBIAN_IMAGE=$BASE_IMAGE" --build-arg "JOBS=$JOBS" \
  --tag "$IMAGE" --file Dockerfile . >"$build_log" 2>&1; then
  t_build=$((SECONDS - t0))
  # What the build stage did: its CMake, CUDA state and the runtime packages.
  grep -E '^cmake version|^(CMAKE_CUDA_COMPILER|TEMB_ENABLE_CUDA):' "$build_log" |
    sed 's/^/    /'
  pass "image $IMAGE builds (${t_build} s)"
else
  t_build=$((SECONDS - t0))
  tail -n 60 "$build_log"
  fail "image $IMAGE builds" "buildah bud failed after ${t_build} s (log: $build_log)"
  finish
fi
# The front: no compile, a Debian package and a file.
t0=$SECONDS
say "building $FRONT_IMAGE (--target front; log: $WORK_DIR/build-front.log)"
if nice -n 19 "${BUILDAH[@]}" bud --isolation chroot --pull=never \
  --format docker --layers=false --force-rm --target front \
  --build-arg "DEBIAN_IMAGE=$BASE_IMAGE" \
  --tag "$FRONT_IMAGE" --file Dockerfile . >"$WORK_DIR/build-front.log" 2>&1; then
  pass "image $FRONT_IMAGE builds ($((SECONDS - t0)) s)"
else
  tail -n 30 "$WORK_DIR/build-front.log"
  fail "image $FRONT_IMAGE builds" "buildah bud failed (log: $WORK_DIR/build-front.log)"
fi
exec 8>&- # the build lock, if taken
# Earlier builds of the same tag are now dangling: free their space.
"${PODMAN[@]}" image prune -f >/dev/null 2>&1

# ---- 3. smoke ------------------------------------------------------------------

t0=$SECONDS

# The image's config: what Kubernetes and `docker run` read.
config="$("${PODMAN[@]}" image inspect --format \
  'user={{.Config.User}} entrypoint={{json .Config.Entrypoint}} ports={{json .Config.ExposedPorts}} health={{json .Config.Healthcheck}}' \
  "$IMAGE" 2>&1)"
if [[ $config == *'user=10001:10001 '* && $config == *'entrypoint=["temb-server"]'* &&
  $config == *'"50051/tcp"'* && $config == *'"9090/tcp"'* &&
  $config == *'"CMD","temb","health","--target=127.0.0.1:50051"'* ]]; then
  pass "image config: user 10001:10001, entrypoint temb-server, ports 50051+9090, HEALTHCHECK temb health"
else
  fail "image config" "$config"
fi

# The manifests deploy what was built here: the cpu overlay's image is
# .../temb:<this tag> (docs/deploy.md, "Push").
if command -v kubectl >/dev/null; then
  deployed="$(kubectl kustomize deploy/overlays/cpu 2>&1 | sed -nE 's/^ +image: *//p' | sort -u)"
else
  deployed="$(sed -nE 's/^ +newName: *//p' deploy/overlays/cpu/kustomization.yaml):$(
    sed -nE 's/^ +newTag: *//p' deploy/overlays/cpu/kustomization.yaml)"
fi
if [[ $deployed == */temb:"${IMAGE##*:}" ]]; then
  pass "deploy/overlays/cpu runs $deployed, the tag built here"
else
  fail "deploy/overlays/cpu runs temb:${IMAGE##*:}" "it runs: ${deployed:-nothing}"
fi

size="$("${PODMAN[@]}" image inspect --format '{{.Size}}' "$IMAGE" 2>/dev/null)"
size="${size:-0}"
say "image size: $((size / 1000000)) MB ($size bytes), budget ${BUDGET_MB} MB"
if ((size > 0 && size <= BUDGET_MB * 1000000)); then
  pass "image size $((size / 1000000)) MB <= ${BUDGET_MB} MB"
else
  fail "image size $((size / 1000000)) MB <= ${BUDGET_MB} MB" \
    "the cpu image grew past its budget (podman history $IMAGE shows the layers)"
fi

who="$("${PODMAN[@]}" run --rm --network none "${RUN_OPTS[@]}" --entrypoint id \
  "$IMAGE" 2>"$SCRATCH/err")"
if [[ $who == "uid=10001(temb) gid=10001(temb) groups=10001(temb)" ]]; then
  pass "default user is temb:temb (10001:10001)"
else
  fail "default user is temb:temb (10001:10001)" "id: $who $(head -c 500 "$SCRATCH/err")"
fi

# start <name> <podman run options and arguments...>: a detached container.
start() {
  local name="$1"
  shift
  containers+=("$name")
  "${PODMAN[@]}" rm -f -t 0 "$name" >/dev/null 2>&1
  # stderr: podman complains that it cannot make a healthcheck timer without
  # systemd (not needed: healthy() runs the check); shown if the run fails.
  "${PODMAN[@]}" run -d --name "$name" "${RUN_OPTS[@]}" "$@" >/dev/null \
    2>"$SCRATCH/start.err" || {
    cat "$SCRATCH/start.err"
    return 1
  }
}
# healthy <name>: the image's own HEALTHCHECK passes within 30 s.
healthy() {
  local i
  for ((i = 0; i < 60; i++)); do
    "${PODMAN[@]}" healthcheck run "$1" >/dev/null 2>&1 && return 0
    [[ "$("${PODMAN[@]}" inspect --format '{{.State.Running}}' "$1" 2>/dev/null)" == true ]] ||
      return 1
    sleep 0.5
  done
  return 1
}
# drains <name>: SIGTERM reaches temb-server (PID 1 in the container), which
# drains (logs event=drained) and exits 0 within 30 s.
drains() {
  local name="$1" code
  "${PODMAN[@]}" kill --signal TERM "$name" >/dev/null || return 1
  code="$(timeout 30 "${PODMAN[@]}" wait "$name" 2>/dev/null)"
  say "$name exited with $code after SIGTERM"
  [[ $code == 0 ]] || return 1
  # The container's last lines can reach `podman logs` a moment after
  # `podman wait` returns: look again before calling the drain unlogged.
  local try
  for ((try = 0; try < 10; try++)); do
    "${PODMAN[@]}" logs "$name" 2>&1 | grep -q 'drained' && return 0
    sleep 0.5
  done
  return 1
}
logs() { "${PODMAN[@]}" logs "$1" 2>&1 | tail -n 20; }

# The requests compared byte for byte with `temb embed --local`.
EMBEDS=(
  "--preset=sdxl --timesteps=999,500,1 --format=json"
  "--preset=sd15 --timesteps=$(seq -s, 0 999) --format=npy"
  "--preset=flux --timesteps=1,0.75,0.5,0.25,0 --dtype=bf16 --format=npy"
  "--dim=8 --flip_sin_to_cos --downscale_freq_shift=0 --timesteps=1 --format=table"
)
# same_as_local <label> <target> <command that runs `temb`...>: `temb embed
# --target` through that command equals `temb embed --local` in the image.
same_as_local() {
  local label="$1" target="$2" i args
  shift 2
  for i in "${!EMBEDS[@]}"; do
    read -ra args <<<"${EMBEDS[$i]}"
    if ! "${PODMAN[@]}" run --rm --network none "${RUN_OPTS[@]}" --entrypoint temb \
      "$IMAGE" embed --local "${args[@]}" >"$SCRATCH/local.$i" 2>"$SCRATCH/err"; then
      fail "$label: ${args[0]}" "temb embed --local failed: $(head -c 500 "$SCRATCH/err")"
      continue
    fi
    if ! "$@" embed --target="$target" "${args[@]}" >"$SCRATCH/remote.$i" 2>"$SCRATCH/err"; then
      fail "$label: ${args[0]}" "temb embed failed: $(head -c 500 "$SCRATCH/err")"
      continue
    fi
    if [[ -s $SCRATCH/local.$i ]] && cmp -s "$SCRATCH/local.$i" "$SCRATCH/remote.$i"; then
      pass "$label: ${args[0]} ${args[-1]}: $(stat -c %s "$SCRATCH/remote.$i") bytes equal to --local"
    else
      fail "$label: ${args[0]}" "server bytes differ from --local: $(cmp "$SCRATCH/local.$i" "$SCRATCH/remote.$i" 2>&1)"
    fi
  done
}

# Containers an interrupted earlier run left behind (this storage is ours).
"${PODMAN[@]}" ps -a --format '{{.Names}}' 2>/dev/null | grep '^temb-smoke-' |
  xargs -r "${PODMAN[@]}" rm -f -t 0 >/dev/null 2>&1

# A: the image exactly as shipped (default CMD, port 50051) with no network:
# its HEALTHCHECK runs inside it.
A="temb-smoke-default-$$"
if start "$A" --network none "$IMAGE" && healthy "$A"; then
  pass "default container: HEALTHCHECK (temb health) reports SERVING"
  pid="$("${PODMAN[@]}" inspect --format '{{.State.Pid}}' "$A")"
  uids="$(awk '/^Uid:/ {print $2, $3, $4, $5}' "/proc/$pid/status" 2>&1)"
  if [[ $uids == "10001 10001 10001 10001" ]]; then
    pass "temb-server runs as uid 10001, not root (host pid $pid)"
  else
    fail "temb-server runs as uid 10001" "/proc/$pid/status Uid: $uids"
  fi
  same_as_local "default container, in-container client" 127.0.0.1:50051 \
    "${PODMAN[@]}" exec "$A" temb
  if drains "$A"; then
    pass "default container drains on SIGTERM and exits 0"
  else
    fail "default container drains on SIGTERM and exits 0" "$(logs "$A")"
  fi
else
  fail "default container: HEALTHCHECK reports SERVING" "$(logs "$A")"
fi

# B: on the host network at free ports, called from another container.
read -r grpc_port metrics_port < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))')
B="temb-smoke-host-$$"
if start "$B" --network host "$IMAGE" --address="127.0.0.1:$grpc_port" \
  --metrics_address="127.0.0.1:$metrics_port" --backend=cpu --log_format=json; then
  client=("${PODMAN[@]}" run --rm --network host "${RUN_OPTS[@]}" --entrypoint temb "$IMAGE")
  for ((i = 0; i < 60; i++)); do
    "${client[@]}" health --target="127.0.0.1:$grpc_port" >/dev/null 2>&1 && break
    sleep 0.5
  done
  if "${client[@]}" health --target="127.0.0.1:$grpc_port" >/dev/null 2>&1; then
    pass "host-network container: temb health from another container reports SERVING"
    same_as_local "host-network container, client container" \
      "127.0.0.1:$grpc_port" "${client[@]}"
    metrics="$(curl -fsS "http://127.0.0.1:$metrics_port/metrics" 2>&1)"
    if grep -q '^temb_requests_total{' <<<"$metrics"; then
      pass "host-network container: /metrics counts the requests"
    else
      fail "host-network container: /metrics" "$(head -c 500 <<<"$metrics")"
    fi
  else
    fail "host-network container: temb health reports SERVING" "$(logs "$B")"
  fi
  if drains "$B"; then
    pass "host-network container drains on SIGTERM and exits 0"
  else
    fail "host-network container drains on SIGTERM and exits 0" "$(logs "$B")"
  fi
else
  fail "host-network container starts" "$(logs "$B")"
fi

# C: a pod as deploy/base lays it out.  temb-server listens on loopback only
# (the base Deployment's addresses) with a model repository mounted
# read-only; the front image joins its network namespace, as a pod's
# containers share one, and holds ports 50051 (gRPC), 8000 (REST) and 9090.
# The host's Python enters that namespace to call through the front.
front_size="$("${PODMAN[@]}" image inspect --format '{{.Size}}' "$FRONT_IMAGE" 2>/dev/null)"
front_size="${front_size:-0}"
if ((front_size > 0 && front_size <= FRONT_BUDGET_MB * 1000000)); then
  pass "front image size $((front_size / 1000000)) MB <= ${FRONT_BUDGET_MB} MB"
else
  fail "front image size $((front_size / 1000000)) MB <= ${FRONT_BUDGET_MB} MB" \
    "(podman history $FRONT_IMAGE shows the layers)"
fi
models="$SCRATCH/models"
cli_in="$SCRATCH/cli"
out="$SCRATCH/out"
if ! "$PYTHON" tests/pylib/tiny_conditioning.py make "$models" \
  --cli_inputs "$cli_in" >"$SCRATCH/make.log" 2>&1; then
  fail "tiny conditioning model made with diffusers" "$(tail -n 20 "$SCRATCH/make.log")"
else
  # save_pretrained writes 0600 files: the server runs as uid 10001.
  chmod -R a+rX "$models" "$cli_in"
  mkdir -p "$out" && chmod 0777 "$out"
  C="temb-smoke-pod-$$"
  F="temb-smoke-front-$$"
  if start "$C" --network none -v "$models:/models:ro" "$IMAGE" \
    --address=127.0.0.1:50052 --http_address=127.0.0.1:8002 \
    --metrics_address=127.0.0.1:9092 --model_repository=/models \
    --conditioning_cache_bytes=67108864 --backend=cpu --log_format=json &&
    start "$F" --network "container:$C" --read-only \
      --tmpfs /tmp:rw,size=64m,mode=1777 "$FRONT_IMAGE"; then
    # Readiness as the Deployment asks it: temb.models, through the front.
    for ((i = 0; i < 60; i++)); do
      "${PODMAN[@]}" exec "$C" temb health --target=127.0.0.1:50051 \
        --service=temb.models >/dev/null 2>&1 && break
      sleep 0.5
    done
    if "${PODMAN[@]}" exec "$C" temb health --target=127.0.0.1:50051 \
      --service=temb.models >"$SCRATCH/health" 2>&1; then
      pass "pod: temb.models SERVING through the front (port 50051)"
    else
      fail "pod: temb.models SERVING through the front" "$(cat "$SCRATCH/health")" \
        "$(logs "$C")" "$(logs "$F")"
    fi
    front_pid="$("${PODMAN[@]}" inspect --format '{{.State.Pid}}' "$F")"
    uids="$(awk '/^Uid:/ {print $2, $3, $4, $5}' "/proc/$front_pid/status" 2>&1)"
    if [[ $uids == "10001 10001 10001 10001" ]]; then
      pass "front: nginx runs as uid 10001 on a read-only root filesystem"
    else
      fail "front: nginx runs as uid 10001" "/proc/$front_pid/status Uid: $uids"
    fi
    if "${PODMAN[@]}" run --rm --network none "${RUN_OPTS[@]}" \
      -v "$models:/models:ro" -v "$cli_in:/in:ro" -v "$out:/out" \
      --entrypoint temb "$IMAGE" condition --model_dir=/models/flux-tiny \
      --timesteps=@/in/timesteps.txt --guidance=3.5 --pooled=/in/pooled.npy \
      --out=/out/cond.safetensors >"$SCRATCH/condition.log" 2>&1; then
      pod_pid="$("${PODMAN[@]}" inspect --format '{{.State.Pid}}' "$C")"
      if nsenter -t "$pod_pid" -n "$PYTHON" tests/pylib/tiny_conditioning.py \
        compare --reference "$out/cond.safetensors" --grpc 127.0.0.1:50051 \
        --http 127.0.0.1:8000 >"$SCRATCH/compare.log" 2>&1; then
        pass "pod: KServe gRPC and REST through the front equal temb condition's bytes"
        sed 's/^/    /' "$SCRATCH/compare.log"
      else
        fail "pod: KServe answers through the front equal temb condition's bytes" \
          "$(cat "$SCRATCH/compare.log")" "$(logs "$C")" "$(logs "$F")"
      fi
      metrics="$(nsenter -t "$pod_pid" -n curl -fsS http://127.0.0.1:9090/metrics 2>&1)"
      if grep -q '^temb_conditioning_model_weight_bytes{model="flux-tiny"}' <<<"$metrics"; then
        pass "pod: /metrics through the front (port 9090) reports the model's weights"
      else
        fail "pod: /metrics through the front" "$(head -c 500 <<<"$metrics")"
      fi
    else
      fail "temb condition in the image" "$(tail -n 20 "$SCRATCH/condition.log")"
    fi
    if drains "$C"; then
      pass "pod: temb-server drains on SIGTERM and exits 0"
    else
      fail "pod: temb-server drains on SIGTERM and exits 0" "$(logs "$C")"
    fi
    # The image's stop signal (SIGQUIT): nginx finishes and exits 0.
    "${PODMAN[@]}" stop -t 10 "$F" >/dev/null 2>&1
    code="$("${PODMAN[@]}" inspect --format '{{.State.ExitCode}}' "$F" 2>/dev/null)"
    if [[ $code == 0 ]]; then
      pass "front stops gracefully on its stop signal and exits 0"
    else
      fail "front stops gracefully and exits 0" "exit code ${code:-?}" "$(logs "$F")"
    fi
  else
    fail "pod: temb-server and the front start" "$(logs "$C")" "$(logs "$F")"
  fi
fi
t_smoke=$((SECONDS - t0))

say "image $IMAGE, $((size / 1000000)) MB; push: docs/deploy.md"
finish
