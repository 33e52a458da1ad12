// The conditioning models' Linear (y = x W^T + b) on a GPU, through
// cuBLASLt (temb/kernels/linear_engine.h).  Plain C++: no CUDA types.
//
// The numerics follow the CPU kernel's contract (temb/kernels/linear.h):
// weights stay in their stored dtype (bf16, fp16 or fp32, uploaded once),
// products accumulate in IEEE float32 (CUBLAS_COMPUTE_32F_PEDANTIC; where
// cuBLASLt has no such algorithm for a shape, CUBLAS_COMPUTE_32F on the
// tensor cores, whose partial sums round less exactly, and name() says
// so), the bias is added to the float32 sum and the result rounded once to
// the output dtype.
// The summation order is cuBLAS's, not the CPU's: a row's bits may differ
// from the CPU's by the rounding of a different order (so a row cache must
// key the engine too).
//
// Batch invariance: cuBLAS picks its algorithm (tiles, split-K) by problem
// size, so the same row summed with 1 or 50 others could round differently.
// Every call therefore runs GEMMs of exactly kRowTile rows (the last one
// padded with zeros) with one algorithm chosen per weight at upload: a
// row's bits depend on its values and the weight only.
#ifndef TEMB_KERNELS_CUDA_LINEAR_H_
#define TEMB_KERNELS_CUDA_LINEAR_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "temb/kernels/dtype.h"
#include "temb/kernels/linear_engine.h"

namespace temb {
namespace cuda {

class CublasLinearEngine final : public LinearEngine {
 public:
  // Rows of every GEMM the engine runs.  A step asks for one row (two with
  // CFG): a smaller tile spends less of the float32 GEMM's arithmetic on
  // padding, and a 50-step plan's few tiles each read the weights again.
  static constexpr int64_t kRowTile = 16;

  // An engine on `device` with its own stream and cuBLASLt handle;
  // FAILED_PRECONDITION when the device does not run (Probe's reason).
  static absl::StatusOr<std::unique_ptr<CublasLinearEngine>> Create(int device);
  ~CublasLinearEngine() override;
  CublasLinearEngine(const CublasLinearEngine&) = delete;
  CublasLinearEngine& operator=(const CublasLinearEngine&) = delete;

  // Copies the parameters to the device and fixes the GEMM's algorithm;
  // returns the Linear's id.  INVALID_ARGUMENT naming the field for sizes
  // that disagree with the shapes or an fp64 dtype; UNAVAILABLE when the
  // device is out of memory or finds no algorithm.
  absl::StatusOr<int> Upload(const LinearWeights& weights) override;

  // out[m, o] for m < rows, as float32 holding values of `out_dtype`; `x`
  // holds rows x in_features values, each representable in the weights'
  // dtype (the models round inputs to it first).  Thread-safe (calls are
  // serialised on the engine's stream).
  absl::Status Forward(int id, absl::Span<const float> x, int64_t rows,
                       DType out_dtype, absl::Span<float> out) override;

  std::string name() const override;
  int64_t device_bytes() const override;
  bool copies_weights() const override { return true; }

 private:
  struct Impl;
  explicit CublasLinearEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cuda
}  // namespace temb

#endif  // TEMB_KERNELS_CUDA_LINEAR_H_
