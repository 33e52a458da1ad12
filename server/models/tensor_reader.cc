#include "tensor_reader.h"

#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "temb/base/quoted.h"
#include "temb/base/status_macros.h"
#include "temb/models/weight_fingerprint.h"
#include "value_codec.h"

namespace temb::models {
namespace {

// Tensor `name` of `shape` as the op reads it: stored as `dtype` (the
// model's dtype) unless `convert`; with `convert`, any stored floating
// dtype is converted to `dtype` as torch's .to(dtype) does: through the
// exact float32 value, rounded to nearest even.
absl::StatusOr<LoadedTensor> LoadAs(const Checkpoint& checkpoint,
                                    const std::string& name, DType dtype,
                                    const std::vector<int64_t>& shape,
                                    bool convert) {
  if (!convert) return checkpoint.Load(name, dtype, shape);
  ASSIGN_OR_RETURN(const DType stored, checkpoint.StoredDType(name));
  ASSIGN_OR_RETURN(LoadedTensor tensor, checkpoint.Load(name, stored, shape));
  if (stored == dtype) return tensor;
  const int64_t count =
      static_cast<int64_t>(tensor.data.size()) / DTypeSize(stored);
  std::vector<float> values(static_cast<size_t>(count));
  DecodeInto(reinterpret_cast<const char*>(tensor.data.data()), count, stored,
             values.data());
  // A new buffer of the converted size: assigning into the stored one would
  // keep its capacity, and an fp32 checkpoint run in bf16 would hold twice
  // the bytes it uses.
  WeightBytes converted(static_cast<size_t>(count) * DTypeSize(dtype));
  for (int64_t i = 0; i < count; ++i) {
    if (dtype == DType::kFloat32) {
      std::memcpy(&converted[i * 4], &values[i], 4);
    } else {
      const uint16_t bits = dtype == DType::kBFloat16
                                ? FloatToBFloat16(values[i])
                                : FloatToHalf(values[i]);
      std::memcpy(&converted[i * 2], &bits, 2);
    }
  }
  tensor.data = std::move(converted);
  tensor.entry.dtype = dtype;
  tensor.entry.dtype_name = std::string(SafetensorsDTypeName(dtype));
  return tensor;
}

// NaN or Inf anywhere in a weight would be served as NaN rows: refused at
// load instead, naming the tensor and the first such element.
absl::Status CheckFinite(const std::string& file, const std::string& name,
                         const LoadedTensor& tensor, DType dtype) {
  const size_t element = DTypeSize(dtype);
  const size_t count = tensor.data.size() / element;
  const uint8_t* bytes = tensor.data.data();
  for (size_t i = 0; i < count; ++i) {
    bool finite;
    if (dtype == DType::kFloat32) {
      uint32_t bits;
      std::memcpy(&bits, bytes + 4 * i, 4);
      finite = (bits & 0x7f800000u) != 0x7f800000u;
    } else {
      uint16_t bits;
      std::memcpy(&bits, bytes + 2 * i, 2);
      finite = dtype == DType::kBFloat16 ? (bits & 0x7f80u) != 0x7f80u
                                         : (bits & 0x7c00u) != 0x7c00u;
    }
    if (!finite) {
      return absl::InvalidArgumentError(
          absl::StrCat(file, ": tensor ", Quoted(name), ": element ", i,
                       " is NaN or infinite; a model's weights must be "
                       "finite"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

TensorReader::TensorReader(const Checkpoint& checkpoint,
                           std::optional<DType> torch_dtype,
                           const std::atomic<bool>* cancelled,
                           absl::Time deadline)
    : checkpoint_(checkpoint),
      convert_(torch_dtype.has_value()),
      cancelled_(cancelled),
      deadline_(deadline),
      dtype_(torch_dtype) {}

absl::StatusOr<DType> TensorReader::DTypeFor(ValueDType where,
                                             const std::string& name) {
  if (where == ValueDType::kFloat32) {
    kept_.insert(name);
    constexpr absl::string_view kWeight = ".weight";
    if (absl::EndsWith(name, kWeight)) {
      kept_.insert(
          absl::StrCat(name.substr(0, name.size() - kWeight.size()), ".bias"));
    }
    return DType::kFloat32;
  }
  if (!dtype_.has_value()) {
    ASSIGN_OR_RETURN(dtype_, checkpoint_.StoredDType(name));
  }
  return *dtype_;
}

absl::StatusOr<LoadedTensor> TensorReader::Load(
    const std::string& name, DType dtype, const std::vector<int64_t>& shape) {
  if (cancelled_ != nullptr && cancelled_->load(std::memory_order_relaxed)) {
    return absl::CancelledError(
        absl::StrCat(checkpoint_.dir(), ": the load was stopped"));
  }
  if (deadline_ != absl::InfiniteFuture() && absl::Now() > deadline_) {
    return absl::DeadlineExceededError(absl::StrCat(
        checkpoint_.dir(), ": the load took too long; stopped before tensor ",
        Quoted(name)));
  }
  ASSIGN_OR_RETURN(LoadedTensor tensor,
                   LoadAs(checkpoint_, name, dtype, shape,
                          convert_ || kept_.count(name) > 0));
  RETURN_IF_ERROR(CheckFinite(checkpoint_.dir(), name, tensor, dtype));
  weight_bytes_ += static_cast<int64_t>(tensor.data.size());
  fingerprints_[name] = WeightFingerprint(
      dtype, absl::MakeConstSpan(tensor.data.data(), tensor.data.size()));
  return tensor;
}

absl::StatusOr<std::vector<float>> TensorReader::LoadValues(
    const std::string& name, DType dtype, const std::vector<int64_t>& shape) {
  ASSIGN_OR_RETURN(const LoadedTensor tensor, Load(name, dtype, shape));
  const int64_t count =
      static_cast<int64_t>(tensor.data.size()) / DTypeSize(dtype);
  std::vector<float> values(static_cast<size_t>(count));
  DecodeInto(reinterpret_cast<const char*>(tensor.data.data()), count, dtype,
             values.data());
  return values;
}

}  // namespace temb::models
