#!/usr/bin/env bash
# Packs what the GPU checks need for a GPU machine that has no build tools or
# gRPC libraries: the binaries (CUDA built in) and every shared library they
# load except the C library itself, into ${BUNDLE:-build-gpu-bundle}.
#   scripts/gpu-bundle.sh            # here, on the build machine
#   scripts/gpu-check.sh             # there, from the repository root
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${BUILD_DIR:-build}"
BUNDLE="${BUNDLE:-build-gpu-bundle}"
TARGETS=(temb-server temb temb-echo-server temb_kernel_benchmark
         temb_cuda_kernel_benchmark temb_backend_benchmark
         temb_parity_test temb_auto_backend_gpu_test temb_cpu_backend_test
         temb_golden_test temb_registry_fallback_test temb_gpu_linear_test)
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DTEMB_ENABLE_CUDA=ON -DTEMB_BUILD_TESTS=ON -DTEMB_BUILD_BENCHMARKS=ON \
  -DTEMB_PYTHON="$PWD/.venv/bin/python" >/dev/null
cmake --build "$BUILD_DIR" --parallel "${JOBS:-$(nproc)}" --target "${TARGETS[@]}"
rm -rf "$BUNDLE"
mkdir -p "$BUNDLE/bin" "$BUNDLE/lib"
for target in "${TARGETS[@]}"; do
  cp "$BUILD_DIR/bin/$target" "$BUNDLE/bin/"
  ldd "$BUILD_DIR/bin/$target" | awk '$3 ~ /^\// {print $3}'
done | sort -u | grep -Ev '/(libc|libm|libpthread|libdl|librt)\.so' \
  | xargs -r cp -L -t "$BUNDLE/lib/"
commit="$(git rev-parse --short HEAD)"
[[ -z "$(git status --porcelain --untracked-files=no)" ]] || commit+=" (with uncommitted changes)"
echo "$commit" >"$BUNDLE/COMMIT"
strip --strip-unneeded "$BUNDLE"/bin/* "$BUNDLE"/lib/* 2>/dev/null || true
du -sh "$BUNDLE"
