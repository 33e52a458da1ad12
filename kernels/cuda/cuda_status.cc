#include "cuda_status.h"

#include "absl/strings/str_cat.h"

namespace temb {
namespace cuda {
namespace {

// Errors that describe the device or its resources rather than a bug: a
// retry elsewhere (or later) may succeed.
bool IsUnavailable(cudaError_t error) {
  switch (error) {
    case cudaErrorMemoryAllocation:
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorDeviceUninitialized:
    case cudaErrorLaunchOutOfResources:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
    case cudaErrorSystemNotReady:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCudartUnloading:
      return true;
    default:
      return false;
  }
}

}  // namespace

std::string DescribeError(cudaError_t error) {
  return absl::StrCat(cudaGetErrorName(error), " (", cudaGetErrorString(error),
                      ")");
}

// OK, or UNAVAILABLE / INTERNAL naming the operation and the CUDA error.
absl::Status Check(cudaError_t error, absl::string_view operation) {
  if (error == cudaSuccess) return absl::OkStatus();
  // Reset the thread's last-error slot so a later, unrelated check does not
  // report this error a second time (sticky errors stay regardless).
  (void)cudaGetLastError();
  std::string message =
      absl::StrCat("CUDA ", operation, " failed: ", DescribeError(error));
  return IsUnavailable(error) ? absl::UnavailableError(message)
                              : absl::InternalError(message);
}

}  // namespace cuda
}  // namespace temb
