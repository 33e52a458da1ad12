// The one interface through which the conditioning models compute their
// Linear layers (y = x W^T + b), whatever the device: each Linear's
// parameters are handed over once (Upload), then called by id.  The CPU
// engine (CreateCpuLinearEngine, temb/kernels/linear.h) borrows the host
// bytes without a copy; the GPU one (the registry's CreateGpuLinearEngine)
// copies them to its device, after which the caller may release them.
#ifndef TEMB_KERNELS_LINEAR_ENGINE_H_
#define TEMB_KERNELS_LINEAR_ENGINE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "temb/kernels/dtype.h"

namespace temb {

// One Linear's parameters in host memory, as a checkpoint stores them:
// `weight` [out_features, in_features] row-major and `bias` [out_features]
// (empty: none), little-endian elements of `dtype`.
struct LinearWeights {
  absl::Span<const uint8_t> weight;
  absl::Span<const uint8_t> bias;
  DType dtype = DType::kFloat32;
  int64_t in_features = 0;
  int64_t out_features = 0;
};

class LinearEngine {
 public:
  virtual ~LinearEngine() = default;

  // Takes the parameters (a copy on the device, or borrowed: see
  // copies_weights()); returns the Linear's id.
  // INVALID_ARGUMENT naming the field for sizes that disagree with the
  // shapes or an unsupported dtype; UNAVAILABLE when the device cannot
  // hold or run it.
  virtual absl::StatusOr<int> Upload(const LinearWeights& weights) = 0;

  // out[m, o] for m < rows, float32 holding values rounded to `out_dtype`,
  // products summed in float32 and the bias added to the sum.  A row's bits
  // depend on its values and the weights only, never on the other rows of
  // the call (batch invariance, which an exact cache needs).  Thread-safe.
  virtual absl::Status Forward(int id, absl::Span<const float> x, int64_t rows,
                               DType out_dtype, absl::Span<float> out) = 0;

  // Names the engine and its device in cache keys and logs ("cuda:0"): rows
  // of different engines are summed in different orders.
  virtual std::string name() const = 0;

  // Device memory held for parameters.
  virtual int64_t device_bytes() const = 0;

  // True: Upload copied the parameters, and the caller may free its bytes.
  // False: the engine reads the caller's bytes, which must then outlive
  // every Forward of that id.
  virtual bool copies_weights() const = 0;
};

}  // namespace temb

#endif  // TEMB_KERNELS_LINEAR_ENGINE_H_
