// The CUDA backend's host-side entry points.  No CUDA types appear here, so
// the registry can include this header from plain C++.
#ifndef TEMB_KERNELS_CUDA_BACKEND_H_
#define TEMB_KERNELS_CUDA_BACKEND_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "temb/kernels/backend.h"

namespace temb {
namespace cuda {

// OK when `device` exists and a probe kernel ran on it; otherwise the reason
// (e.g. no driver: cudaGetDeviceCount returns "insufficient driver").
absl::Status Probe(int device);

// A backend bound to `device`; FAILED_PRECONDITION when Probe() fails.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device);

}  // namespace cuda
}  // namespace temb

#endif  // TEMB_KERNELS_CUDA_BACKEND_H_
