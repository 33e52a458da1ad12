// Whether a device really works: a kernel runs and writes what it should.
#include <cuda_runtime_api.h>

#include <memory>

#include "absl/strings/str_cat.h"
#include "cuda_status.h"
#include "temb/base/status_macros.h"
#include "temb/kernels/cuda_backend.h"
#include "temb/kernels/embed_kernel.cuh"

namespace temb {
namespace cuda {
namespace {

struct DeviceFree {
  void operator()(void* p) const { (void)cudaFree(p); }
};

absl::Status RunProbeKernel(int device) {
  ScopedDevice restore;
  RETURN_IF_ERROR(Check(cudaSetDevice(device), "cudaSetDevice"));
  void* raw = nullptr;
  RETURN_IF_ERROR(
      Check(cudaMalloc(&raw, kProbeValues * sizeof(int)), "cudaMalloc"));
  std::unique_ptr<void, DeviceFree> buffer(raw);
  constexpr int kSeed = 0x2a17;
  int* values = static_cast<int*>(raw);
  RETURN_IF_ERROR(
      Check(LaunchProbe(values, kSeed, nullptr), "probe kernel launch"));
  int host[kProbeValues] = {};
  RETURN_IF_ERROR(
      Check(cudaMemcpy(host, values, sizeof host, cudaMemcpyDeviceToHost),
            "cudaMemcpy"));
  for (int i = 0; i < kProbeValues; ++i) {
    if (host[i] != ProbeValue(kSeed, i)) {
      return absl::InternalError(absl::StrCat("probe kernel wrote ", host[i],
                                              " at ", i, ", expected ",
                                              ProbeValue(kSeed, i)));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Probe(int device) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    // Without a driver this is cudaErrorInsufficientDriver, not
    // cudaErrorNoDevice; either way there is nothing to run on.
    (void)cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat(
        "cudaGetDeviceCount failed: ", DescribeError(error),
        "; is an NVIDIA GPU with a recent enough driver present?"));
  }
  if (count <= 0) return absl::FailedPreconditionError("no CUDA device found");
  if (device < 0 || device >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA device ", device, " does not exist (", count,
                     " device(s) found)"));
  }
  const absl::Status probe = RunProbeKernel(device);
  if (!probe.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "probe kernel failed on CUDA device ", device, ": ", probe.message()));
  }
  return absl::OkStatus();
}

}  // namespace cuda
}  // namespace temb
