// The only file that knows whether the CUDA backend was compiled in.
#include "temb/kernels/registry.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "cpu/cpu_backend.h"
#include "temb/kernels/size_router.h"
#if TEMB_WITH_CUDA
#include "cuda/cuda_backend.h"
#endif

namespace temb {

absl::string_view BackendKindName(BackendKind kind) {
  return kind == BackendKind::kCuda ? "cuda" : "cpu";
}

absl::StatusOr<BackendChoice> ParseBackendChoice(absl::string_view name) {
  if (name == "auto") return BackendChoice::kAuto;
  if (name == "cpu") return BackendChoice::kCpu;
  if (name == "cuda") return BackendChoice::kCuda;
  return absl::InvalidArgumentError(
      absl::StrCat("backend must be one of auto, cpu, cuda, got \"", name, "\""));
}

bool CudaBuiltIn() { return TEMB_WITH_CUDA != 0; }

namespace {

absl::Status CudaStatus(int device) {
#if TEMB_WITH_CUDA
  return cuda::Probe(device);
#else
  (void)device;
  return absl::FailedPreconditionError(
      "this binary was built without CUDA (TEMB_ENABLE_CUDA=OFF)");
#endif
}

}  // namespace

bool CudaUsable(int device) { return CudaStatus(device).ok(); }

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(
    BackendChoice choice, const BackendOptions& options) {
  if (choice == BackendChoice::kCpu) return CreateCpuBackend(options.cpu_threads);
  const absl::Status cuda = CudaStatus(options.cuda_device);
  if (choice == BackendChoice::kAuto && !cuda.ok()) {
    return CreateCpuBackend(options.cpu_threads);
  }
  if (!cuda.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("backend=cuda requested but no usable CUDA device: ",
                     cuda.message()));
  }
#if TEMB_WITH_CUDA
  auto gpu = cuda::CreateCudaBackend(options.cuda_device);
  if (!gpu.ok() || choice == BackendChoice::kCuda || options.gpu_min_output_bytes <= 0) {
    return gpu;
  }
  return RouteBySize(CreateCpuBackend(options.cpu_threads), std::move(*gpu),
                     options.gpu_min_output_bytes);
#else
  return cuda;  // unreachable: CudaStatus() is never OK without CUDA
#endif
}

}  // namespace temb
