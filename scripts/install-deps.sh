#!/usr/bin/env bash
# Installs everything temb needs to build, test and serve on Debian 12:
# Debian packages (skipped when already present) and a Python virtualenv in
# .venv for the Python client and the protocol-compatibility tests.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git ca-certificates
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev prometheus-cpp-dev
  libsleef-dev libspdlog-dev libfmt-dev nlohmann-json3-dev
  libssl-dev  # the service core's SHA-256 (also pulled in by libgrpc++-dev)
  libboost-dev  # Boost.Beast and Asio (header-only): the KServe REST frontend (server/rest)
  openssl curl procps python3 python3-venv python3-pip
  libb64-0d  # needed by the PyPI perf_analyzer binary (KServe load tests)
  # scripts/fuzz.sh: clang with libFuzzer and the sanitizer runtimes
  # (libclang-rt-14-dev is only a Recommends of clang-14), LLVM's OpenMP for
  # the CPU backend, llvm-symbolizer for readable reports.
  clang-14 libclang-rt-14-dev libomp-14-dev llvm-14
  clang-format-14  # scripts/check-format.sh (a ctest entry)
  nginx-light  # deploy/front: the hardened HTTP/2 front (tests/reliability)
  # scripts/container-smoke.sh: builds and runs the image with no Docker
  # daemon (buildah, podman with runc; crun fails on the CI machines) from a
  # base bootstrapped with mmdebstrap.
  buildah podman runc conmon containernetworking-plugins catatonit mmdebstrap
)

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get -o DPkg::Lock::Timeout=900 update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=900 \
    install -y -qq --no-install-recommends "${missing[@]}"
fi

# nvcc is optional: the CUDA toolkit is not a Debian package here.  When it is
# installed (/usr/local/cuda) CMake finds it and builds the CUDA backend.

if [[ "${TEMB_SKIP_PYTHON:-0}" != 1 ]]; then
  PYTHON="${PYTHON:-python3}"
  if [[ ! -x .venv/bin/python ]]; then
    "$PYTHON" -m venv .venv
  fi
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -r scripts/requirements-dev.txt
fi
echo "install-deps: done"
