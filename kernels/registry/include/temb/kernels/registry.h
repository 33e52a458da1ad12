// Which backends exist.  The registry is the only code that knows whether the
// CUDA backend was built in.
#ifndef TEMB_KERNELS_REGISTRY_H_
#define TEMB_KERNELS_REGISTRY_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "temb/kernels/backend.h"
#include "temb/kernels/linear_engine.h"

namespace temb {

enum class BackendChoice : uint8_t { kAuto = 0, kCpu = 1, kCuda = 2 };

// Parses "auto" | "cpu" | "cuda"; INVALID_ARGUMENT otherwise.
absl::StatusOr<BackendChoice> ParseBackendChoice(absl::string_view name);

struct BackendOptions {
  // Worker threads the CPU backend may use for one large request
  // (0 = hardware concurrency).
  int cpu_threads = 0;
  // CUDA device ordinal.
  int cuda_device = 0;
  // kAuto with a usable GPU: outputs of at least this many bytes run on the
  // GPU, smaller ones on the CPU (size_router.h); 0 sends all to the GPU.
  // 1 MiB is where the GPU started to win in the service under 16
  // concurrent clients on an H100 machine (docs/benchmarks-gpu.md).
  int64_t gpu_min_output_bytes = int64_t{1} << 20;
};

// True when the CUDA backend was compiled into this binary.
bool CudaBuiltIn();

// True when CUDA is built in and a device really works (a probe kernel ran).
bool CudaUsable(int device = 0);

// kAuto: CUDA when CudaUsable() (with the CPU for outputs under
// options.gpu_min_output_bytes), else CPU.  kCuda without a usable device:
// FAILED_PRECONDITION explaining why (not built in, or the probe's error).
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(
    BackendChoice choice, const BackendOptions& options = {});

// The conditioning models' Linear layers on GPU `device` (cuBLASLt);
// FAILED_PRECONDITION when CUDA is not built in or the device does not run.
absl::StatusOr<std::unique_ptr<LinearEngine>> CreateGpuLinearEngine(
    int device = 0);

}  // namespace temb

#endif  // TEMB_KERNELS_REGISTRY_H_
