# syntax=docker/dockerfile:1
# temb server images, two targets, and the front (docs/deploy.md):
#   gpu (the default, last stage): CUDA backend, serves on the GPU when the
#       container is given one (docker run --gpus all, nvidia.com/gpu in
#       Kubernetes) and on the CPU otherwise;
#   cpu (--target cpu): CPU backend only, on a Debian base, no CUDA at all;
#   front (--target front): nginx with deploy/front/nginx.conf, the proxy
#       every shipped manifest puts before temb-server's ports.
# Each target has its own build stage on the same distribution as its runtime
# stage, so the runtime stage installs the distribution packages that hold the
# exact shared libraries the build linked against.  scripts/container-smoke.sh
# builds and tests the cpu target without a Docker daemon or a registry.
#
# Base images are build arguments.  NVIDIA publishes CUDA images for Ubuntu,
# not Debian; Ubuntu 24.04 ships the same gRPC 1.51, Protobuf 3.21 and Abseil
# 20220623 as the Debian 12 machines the project is developed on.
ARG CUDA_VERSION=13.0.2
ARG CUDA_BUILD_IMAGE=nvidia/cuda:${CUDA_VERSION}-devel-ubuntu24.04
ARG CUDA_RUNTIME_IMAGE=nvidia/cuda:${CUDA_VERSION}-base-ubuntu24.04
ARG DEBIAN_IMAGE=debian:bookworm-slim
# CMake from PyPI: Debian 12's CMake 3.25.1 cannot configure CUDA 13 (its
# FindCUDAToolkit fails on the removed nvToolsExt library).  Pinned.
ARG CMAKE_VERSION=3.31.6
# Parallel compile jobs; empty means every CPU the build sees.
ARG JOBS=
# What the build stages install: compilers and the -dev packages of the
# libraries temb links, the same names on Debian 12 and Ubuntu 24.04.  A
# subset of scripts/install-deps.sh (no tests, benchmarks, fuzzers, ccache):
# a library added to the build goes in both, or CI's container stage fails.
ARG BUILD_PACKAGES="g++ make ninja-build pkg-config ca-certificates \
  python3-venv libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev \
  protobuf-compiler libabsl-dev prometheus-cpp-dev libsleef-dev \
  libspdlog-dev libfmt-dev nlohmann-json3-dev libboost-dev"

# ---- front -------------------------------------------------------------------

# The nginx front that every shipped manifest puts before temb-server
# (deploy/front/README.md): Debian 12's nginx-light and deploy/front/nginx.conf.
# Runs as uid 10001 with a read-only root filesystem: nginx writes only under
# /tmp (its temporary paths and pid) and logs to stderr.  Kubernetes mounts
# the ConfigMap generated from the same file over /etc/temb.  First in the
# file: a daemonless build of --target front runs no stage after it, so no
# compile.
FROM ${DEBIAN_IMAGE} AS front
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Unpinned on purpose: bookworm's nginx-light takes only security fixes, which
# a rebuild should pick up.
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      nginx-light \
 && rm -rf /var/lib/apt/lists/* /etc/nginx/sites-enabled/* \
 && groupadd --gid 10001 temb \
 && useradd --uid 10001 --gid temb --no-create-home \
      --home-dir /nonexistent --shell /usr/sbin/nologin temb
COPY deploy/front/nginx.conf /etc/temb/nginx.conf
LABEL org.opencontainers.image.title="temb-front" \
      org.opencontainers.image.description="nginx front for temb-server: caps HTTP/2 header blocks (CVE-2023-33953)"
USER 10001:10001
# gRPC, KServe REST, /metrics; temb-server listens on loopback behind them.
EXPOSE 50051 8000 9090
# SIGQUIT: nginx finishes the requests it is proxying before it exits.
STOPSIGNAL SIGQUIT
# -e stderr: nginx would open its compiled-in error log (under /var/log)
# before it reads the config's error_log.
ENTRYPOINT ["nginx", "-e", "stderr", "-c", "/etc/temb/nginx.conf"]

# ---- cpu -------------------------------------------------------------------

FROM ${DEBIAN_IMAGE} AS build-debian
ARG BUILD_PACKAGES
ARG CMAKE_VERSION
ARG JOBS
# Extra CMake arguments.  Without any, CUDA is on exactly when nvcc is at
# /usr/local/cuda (the project's own default): never in the stock Debian
# image, so the cpu target has no CUDA backend.
ARG CMAKE_ARGS=
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Dependencies in their own layers: source edits do not reinstall them.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive xargs apt-get install -y --no-install-recommends \
      <<<"${BUILD_PACKAGES}" \
 && rm -rf /var/lib/apt/lists/*
# Behind a TLS-inspecting proxy, pass the build machine's CA bundle as a
# secret: --secret id=ca-certificates,src=/etc/ssl/certs/ca-certificates.crt
RUN --mount=type=secret,id=ca-certificates \
    cert=(); if [[ -s /run/secrets/ca-certificates ]]; then \
      cert=(--cert /run/secrets/ca-certificates); fi \
 && python3 -m venv /opt/cmake \
 && /opt/cmake/bin/pip install --no-cache-dir --disable-pip-version-check \
      "${cert[@]}" "cmake==${CMAKE_VERSION}" \
 && ln -s /opt/cmake/bin/cmake /opt/cmake/bin/ctest /usr/local/bin/ \
 && cmake --version
WORKDIR /src
COPY . .
# Only the two shipped programs: no tests, benchmarks or fuzzers.
RUN read -ra extra <<<"${CMAKE_ARGS}" \
 && cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DTEMB_BUILD_TESTS=OFF -DTEMB_BUILD_BENCHMARKS=OFF "${extra[@]}" \
 && grep -E '^(CMAKE_CUDA_COMPILER|TEMB_ENABLE_CUDA):' /build/CMakeCache.txt \
 && cmake --build /build --parallel "${JOBS:-$(nproc)}" --target temb-server temb \
 && deploy/docker/runtime-packages.sh /build/bin/temb-server /build/bin/temb \
      > /build/runtime-packages.txt \
 && cat /build/runtime-packages.txt

FROM ${DEBIAN_IMAGE} AS cpu
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY --from=build-debian /build/runtime-packages.txt /tmp/runtime-packages.txt
# A named user and group, uid/gid 10001, no home, no shell.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive xargs --arg-file=/tmp/runtime-packages.txt \
      apt-get install -y --no-install-recommends \
 && rm -rf /var/lib/apt/lists/* /tmp/runtime-packages.txt \
 && groupadd --gid 10001 temb \
 && useradd --uid 10001 --gid temb --no-create-home \
      --home-dir /nonexistent --shell /usr/sbin/nologin temb
COPY --from=build-debian /build/bin/temb-server /build/bin/temb /usr/local/bin/
RUN ! ldd /usr/local/bin/temb-server /usr/local/bin/temb | grep "not found"
LABEL org.opencontainers.image.title="temb" \
      org.opencontainers.image.description="Sinusoidal timestep embeddings over gRPC (CPU backend)"
# Numeric so that Kubernetes' runAsNonRoot can verify it.
USER 10001:10001
# At most 4 malloc arenas, each keeping under 64 MiB of freed heap: the
# term of the memory bound in docs/operations.md that glibc would otherwise
# scale with the cores.
ENV MALLOC_ARENA_MAX=4
# gRPC (temb.v1, KServe v2, health) and Prometheus /metrics.
EXPOSE 50051 9090
HEALTHCHECK --interval=15s --timeout=5s --start-period=10s --retries=3 \
  CMD ["temb", "health", "--target=127.0.0.1:50051"]
ENTRYPOINT ["temb-server"]
CMD ["--address=0.0.0.0:50051", "--metrics_address=0.0.0.0:9090", "--backend=cpu"]

# ---- gpu (default) -----------------------------------------------------------

FROM ${CUDA_BUILD_IMAGE} AS build-cuda
# sm_80 A100, sm_89 L4/L40, sm_90 H100/H200.  The build has no GPU to probe.
ARG CUDA_ARCHITECTURES="80;89;90"
ARG BUILD_PACKAGES
ARG CMAKE_VERSION
ARG JOBS
ARG CMAKE_ARGS=
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive xargs apt-get install -y --no-install-recommends \
      <<<"${BUILD_PACKAGES}" \
 && rm -rf /var/lib/apt/lists/*
RUN --mount=type=secret,id=ca-certificates \
    cert=(); if [[ -s /run/secrets/ca-certificates ]]; then \
      cert=(--cert /run/secrets/ca-certificates); fi \
 && python3 -m venv /opt/cmake \
 && /opt/cmake/bin/pip install --no-cache-dir --disable-pip-version-check \
      "${cert[@]}" "cmake==${CMAKE_VERSION}" \
 && ln -s /opt/cmake/bin/cmake /opt/cmake/bin/ctest /usr/local/bin/ \
 && cmake --version
WORKDIR /src
COPY . .
RUN read -ra extra <<<"${CMAKE_ARGS}" \
 && cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DTEMB_BUILD_TESTS=OFF -DTEMB_BUILD_BENCHMARKS=OFF \
      -DTEMB_ENABLE_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES}" \
      "${extra[@]}" \
 && cmake --build /build --parallel "${JOBS:-$(nproc)}" --target temb-server temb \
 && deploy/docker/runtime-packages.sh /build/bin/temb-server /build/bin/temb \
      > /build/runtime-packages.txt \
 && cat /build/runtime-packages.txt

# "base" carries no CUDA libraries: the binaries link the CUDA runtime
# statically and the driver is mounted from the host by the NVIDIA container
# toolkit.  Its NVIDIA_* environment makes the toolkit do that.
FROM ${CUDA_RUNTIME_IMAGE} AS gpu
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY --from=build-cuda /build/runtime-packages.txt /tmp/runtime-packages.txt
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive xargs --arg-file=/tmp/runtime-packages.txt \
      apt-get install -y --no-install-recommends \
 && rm -rf /var/lib/apt/lists/* /tmp/runtime-packages.txt \
 && groupadd --gid 10001 temb \
 && useradd --uid 10001 --gid temb --no-create-home \
      --home-dir /nonexistent --shell /usr/sbin/nologin temb
COPY --from=build-cuda /build/bin/temb-server /build/bin/temb /usr/local/bin/
RUN ! ldd /usr/local/bin/temb-server /usr/local/bin/temb | grep "not found"
LABEL org.opencontainers.image.title="temb" \
      org.opencontainers.image.description="Sinusoidal timestep embeddings over gRPC (CUDA and CPU backends)"
USER 10001:10001
ENV MALLOC_ARENA_MAX=4
EXPOSE 50051 9090
HEALTHCHECK --interval=15s --timeout=5s --start-period=10s --retries=3 \
  CMD ["temb", "health", "--target=127.0.0.1:50051"]
ENTRYPOINT ["temb-server"]
CMD ["--address=0.0.0.0:50051", "--metrics_address=0.0.0.0:9090", "--backend=auto"]
