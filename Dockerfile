# syntax=docker/dockerfile:1
# temb server image: serves on the GPU when the container is given one
# (docker run --gpus all, or nvidia.com/gpu in Kubernetes) and on the CPU
# otherwise.  See docs/deploy.md.
#
# Ubuntu 24.04 ships the same gRPC 1.51, Protobuf 3.21 and Abseil 20220623 as
# the Debian 12 machines the project is developed and tested on, so the build
# stage runs the project's own scripts unchanged and the runtime stage can
# take the shared libraries from the distribution instead of building them.
ARG CUDA_VERSION=13.0.2
ARG UBUNTU_VERSION=24.04

FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu${UBUNTU_VERSION} AS build
# sm_80 A100, sm_89 L4/L40, sm_90 H100/H200.  The build has no GPU to probe.
ARG CUDA_ARCHITECTURES="80;89;90"
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /src
# Dependencies in their own layer: source edits do not reinstall them.
COPY scripts/install-deps.sh scripts/
RUN TEMB_SKIP_PYTHON=1 scripts/install-deps.sh
COPY . .
RUN --mount=type=cache,target=/root/.cache/ccache \
    BUILD_DIR=/build scripts/build.sh \
      -DTEMB_ENABLE_CUDA=ON \
      "-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES}" \
      -DTEMB_BUILD_TESTS=OFF -DTEMB_BUILD_BENCHMARKS=OFF \
 && deploy/docker/runtime-packages.sh /build/bin/temb-server /build/bin/temb \
      > /build/runtime-packages.txt \
 && cat /build/runtime-packages.txt

# "base" carries no CUDA libraries: the binaries link the CUDA runtime
# statically and the driver is mounted from the host by the NVIDIA container
# toolkit.  Its NVIDIA_* environment makes the toolkit do that.
FROM nvidia/cuda:${CUDA_VERSION}-base-ubuntu${UBUNTU_VERSION} AS runtime
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY --from=build /build/runtime-packages.txt /tmp/runtime-packages.txt
RUN apt-get update \
 && xargs --arg-file=/tmp/runtime-packages.txt \
      apt-get install -y --no-install-recommends \
 && rm -rf /var/lib/apt/lists/* /tmp/runtime-packages.txt \
 && useradd --system --uid 10001 --user-group --no-create-home \
      --shell /usr/sbin/nologin temb
COPY --from=build /build/bin/temb-server /build/bin/temb /usr/local/bin/

LABEL org.opencontainers.image.title="temb" \
      org.opencontainers.image.description="Sinusoidal timestep embeddings for diffusion models over gRPC"

# Numeric so that Kubernetes' runAsNonRoot can verify it without /etc/passwd.
USER 10001:10001
# gRPC (temb.v1, KServe v2, health) and Prometheus /metrics.
EXPOSE 50051 9090
HEALTHCHECK --interval=15s --timeout=5s --start-period=10s --retries=3 \
  CMD ["temb", "health", "--target=127.0.0.1:50051"]
ENTRYPOINT ["temb-server"]
CMD ["--address=0.0.0.0:50051", "--metrics_address=0.0.0.0:9090", "--backend=auto"]
