// The only file that knows whether the CUDA backend was compiled in.
#include "temb/kernels/registry.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "temb/base/status_macros.h"
#include "temb/kernels/cpu_backend.h"
#include "temb/kernels/size_router.h"
#if TEMB_WITH_CUDA
#include "temb/kernels/cuda_backend.h"
#include "temb/kernels/cuda_linear.h"
#endif

namespace temb {

absl::StatusOr<BackendChoice> ParseBackendChoice(absl::string_view name) {
  if (name == "auto") return BackendChoice::kAuto;
  if (name == "cpu") return BackendChoice::kCpu;
  if (name == "cuda") return BackendChoice::kCuda;
  return absl::InvalidArgumentError(absl::StrCat(
      "backend must be one of auto, cpu, cuda, got \"", name, "\""));
}

bool CudaBuiltIn() { return TEMB_WITH_CUDA != 0; }

bool CudaUsable(int device) {
#if TEMB_WITH_CUDA
  return cuda::Probe(device).ok();
#else
  (void)device;
  return false;
#endif
}

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(
    BackendChoice choice, const BackendOptions& options) {
  if (choice == BackendChoice::kCpu)
    return CreateCpuBackend(options.cpu_threads);
#if TEMB_WITH_CUDA
  // CreateCudaBackend probes the device: once, here, for every choice.
  absl::StatusOr<std::unique_ptr<Backend>> gpu =
      cuda::CreateCudaBackend(options.cuda_device);
  if (!gpu.ok()) {
    if (choice == BackendChoice::kAuto)
      return CreateCpuBackend(options.cpu_threads);
    return absl::FailedPreconditionError(
        absl::StrCat("backend=cuda requested but no usable CUDA device: ",
                     gpu.status().message()));
  }
  if (choice == BackendChoice::kCuda || options.gpu_min_output_bytes <= 0)
    return gpu;
  return RouteBySize(CreateCpuBackend(options.cpu_threads), std::move(*gpu),
                     options.gpu_min_output_bytes);
#else
  if (choice == BackendChoice::kAuto)
    return CreateCpuBackend(options.cpu_threads);
  return absl::FailedPreconditionError(
      "backend=cuda requested but no usable CUDA device: this binary was built "
      "without CUDA (TEMB_ENABLE_CUDA=OFF)");
#endif
}

absl::StatusOr<std::unique_ptr<LinearEngine>> CreateGpuLinearEngine(
    int device) {
#if TEMB_WITH_CUDA
  ASSIGN_OR_RETURN(std::unique_ptr<cuda::CublasLinearEngine> engine,
                   cuda::CublasLinearEngine::Create(device));
  return std::unique_ptr<LinearEngine>(std::move(engine));
#else
  (void)device;
  return absl::FailedPreconditionError(
      "this build has no CUDA: build with -DTEMB_ENABLE_CUDA=ON");
#endif
}

}  // namespace temb
