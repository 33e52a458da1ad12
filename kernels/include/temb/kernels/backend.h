// Backend: one way of computing embeddings (CPU, CUDA, ...).
//
// Host memory in, host memory out: device memory never crosses this
// interface.  Backends trust their inputs: callers validate with
// ValidateRequest() (embedding_spec.h) first.
#ifndef TEMB_KERNELS_BACKEND_H_
#define TEMB_KERNELS_BACKEND_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "temb/kernels/embedding_spec.h"

namespace temb {

enum class BackendKind : uint8_t { kCpu = 0, kCuda = 1 };

absl::string_view BackendKindName(BackendKind kind);  // "cpu" | "cuda"

class Backend {
 public:
  virtual ~Backend() = default;

  virtual BackendKind kind() const = 0;
  // A human-readable device description, e.g. "x86-64 avx2, 2 threads" or
  // "NVIDIA H100 80GB HBM3 (sm_90)".
  virtual std::string device() const = 0;

  // Writes the [timesteps.size(), spec.dim] embedding, row-major, elements of
  // spec.dtype in little-endian order, into `out`.
  // Preconditions: ValidateRequest(spec, timesteps, ...) is OK and
  // out.size() == OutputBytes(spec, timesteps.size()).  `out` may be
  // uninitialised: every byte is written, zero columns included.
  // Thread-safe: may be called concurrently from many threads.
  // Errors: INTERNAL or UNAVAILABLE when the device fails (e.g. a CUDA error);
  // never for a valid request on a healthy device.
  virtual absl::Status Compute(const EmbeddingSpec& spec,
                               absl::Span<const float> timesteps,
                               absl::Span<uint8_t> out) = 0;
};

}  // namespace temb

#endif  // TEMB_KERNELS_BACKEND_H_
