// Backend: one way of computing embeddings (CPU, CUDA, ...).
//
// Host memory in, host memory out: device memory never crosses this
// interface.  Backends trust their inputs: callers validate with
// ValidateRequest() (embedding_spec.h) first.
#ifndef TEMB_KERNELS_BACKEND_H_
#define TEMB_KERNELS_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "temb/kernels/embedding_spec.h"

namespace temb {

enum class BackendKind : uint8_t { kCpu = 0, kCuda = 1 };

// Host memory owned by a backend, lent to a caller to compute an output
// into (Backend::AllocateOutput).  Destroying it gives the memory back; that
// may happen on any thread, after the backend itself is gone.
class HostBuffer {
 public:
  virtual ~HostBuffer() = default;
  virtual absl::Span<uint8_t> bytes() = 0;
};

absl::string_view BackendKindName(BackendKind kind);  // "cpu" | "cuda"

class Backend {
 public:
  virtual ~Backend() = default;

  virtual BackendKind kind() const = 0;
  // A human-readable device description, e.g. "x86-64 avx2, 2 threads" or
  // "NVIDIA H100 80GB HBM3 (sm_90)".
  virtual std::string device() const = 0;

  // The kind that computes a request whose output has `output_bytes` bytes:
  // kind(), except for a backend that routes requests between others.
  virtual BackendKind KindFor(int64_t output_bytes) const {
    (void)output_bytes;
    return kind();
  }

  // Memory that this backend writes an output of `bytes` bytes into faster
  // than into ordinary memory, or nullptr (the default) when it has none:
  // the CUDA backend lends page-locked memory, which the device writes
  // directly instead of through a staging buffer and a host copy.  A caller
  // that can keep the result where it was computed (a server sending it)
  // asks first and passes the buffer's bytes to Compute() as `out`.
  virtual std::unique_ptr<HostBuffer> AllocateOutput(size_t bytes) {
    (void)bytes;
    return nullptr;
  }

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
