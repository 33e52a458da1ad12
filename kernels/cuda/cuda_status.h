// CUDA errors as absl::Status, at the first host boundary, and the small
// RAII helpers every CUDA source of this backend needs.  Private to
// kernels/cuda.
#ifndef TEMB_KERNELS_CUDA_CUDA_STATUS_H_
#define TEMB_KERNELS_CUDA_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace temb {
namespace cuda {

// "cudaErrorX (description)".
std::string DescribeError(cudaError_t error);

// OK, or UNAVAILABLE (the device or its resources: a retry elsewhere may
// succeed) / INTERNAL, naming the operation and the CUDA error.
absl::Status Check(cudaError_t error, absl::string_view operation);

// Restores the calling thread's current device on scope exit.
class ScopedDevice {
 public:
  ScopedDevice() {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      (void)cudaGetLastError();
      previous_ = -1;
    }
  }
  ~ScopedDevice() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

 private:
  int previous_ = -1;
};

struct DeviceFree {
  void operator()(void* p) const { (void)cudaFree(p); }
};

// Page-locked host memory (cudaMallocHost).
struct PinnedFree {
  void operator()(void* p) const { (void)cudaFreeHost(p); }
};

}  // namespace cuda
}  // namespace temb

#endif  // TEMB_KERNELS_CUDA_CUDA_STATUS_H_
