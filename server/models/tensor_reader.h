// The checkpoint tensors a model's ops read, each in the dtype the model
// computes with, counted and fingerprinted as they are read.
#ifndef TEMB_MODELS_TENSOR_READER_H_
#define TEMB_MODELS_TENSOR_READER_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "temb/kernels/dtype.h"
#include "temb/models/checkpoint.h"
#include "temb/models/family.h"

namespace temb::models {

class TensorReader {
 public:
  // `torch_dtype` set: every tensor read in the model's dtype is converted
  // to it, from any stored floating dtype.  Unset: the model's dtype is the
  // stored dtype of the first such tensor read, and every other one must
  // be stored in it (Checkpoint::Load checks).
  // `cancelled` (may be null): when it turns true, the next Load is
  // CANCELLED; past `deadline`, the next Load is DEADLINE_EXCEEDED.
  TensorReader(const Checkpoint& checkpoint, std::optional<DType> torch_dtype,
               const std::atomic<bool>* cancelled = nullptr,
               absl::Time deadline = absl::InfiniteFuture());

  // The dtype an op reads tensor `name` as: float32 for kept modules
  // (`where` is kFloat32; `name`, and for a "<module>.weight" its bias,
  // are then kept tensors), else the model's dtype, which the first call
  // sets from `name`'s stored dtype when no torch_dtype did.
  absl::StatusOr<DType> DTypeFor(ValueDType where, const std::string& name);

  // Tensor `name` of `shape` as elements of `dtype` (one DTypeFor gave):
  // with a torch_dtype, or for a kept tensor, any stored floating dtype
  // converted as torch's .to(dtype) converts it; else it must be stored
  // in the model's dtype (INVALID_ARGUMENT naming the tensor: a folder's
  // tensors have one dtype unless its temb.json converts them).
  absl::StatusOr<LoadedTensor> Load(const std::string& name, DType dtype,
                                    const std::vector<int64_t>& shape);
  // The same, decoded to float32 values (tables and norm weights).
  absl::StatusOr<std::vector<float>> LoadValues(
      const std::string& name, DType dtype, const std::vector<int64_t>& shape);

  // The tensors the checkpoint names (Checkpoint::tensor_count).
  int64_t tensor_count() const { return checkpoint_.tensor_count(); }

  // The model's dtype once a tensor set it (or the torch_dtype), else
  // float32.
  DType model_dtype() const { return dtype_.value_or(DType::kFloat32); }
  int64_t weight_bytes() const { return weight_bytes_; }
  // Each tensor read: WeightFingerprint of its bytes in the dtype read as.
  const std::map<std::string, std::string>& fingerprints() const {
    return fingerprints_;
  }

 private:
  const Checkpoint& checkpoint_;
  const bool convert_;
  const std::atomic<bool>* const cancelled_;
  const absl::Time deadline_;
  std::optional<DType> dtype_;
  // The tensors of kept (float32) modules that DTypeFor named.
  std::set<std::string> kept_;
  int64_t weight_bytes_ = 0;
  std::map<std::string, std::string> fingerprints_;
};

}  // namespace temb::models

#endif  // TEMB_MODELS_TENSOR_READER_H_
