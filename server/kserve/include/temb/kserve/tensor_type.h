// The KServe v2 tensor datatypes.  A tensor's "datatype" string is parsed
// into a TensorType once, where a message is read (as Triton's
// ProtocolStringToDataType does); everything after that switches on the
// enum.  tensor_type.cc is the only place that compares the names.
#ifndef TEMB_KSERVE_TENSOR_TYPE_H_
#define TEMB_KSERVE_TENSOR_TYPE_H_

#include <cstddef>
#include <cstdint>
#include <optional>

#include "absl/strings/string_view.h"
#include "temb/kernels/dtype.h"

namespace temb::kserve {

enum class TensorType : uint8_t {
  kBool,
  kUint8,
  kUint16,
  kUint32,
  kUint64,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kFp16,
  kBf16,
  kFp32,
  kFp64,
  kBytes,
};

// "FP32" -> kFp32; nullopt for a name the protocol does not define (names
// are case-sensitive, as in the protocol).
std::optional<TensorType> ParseTensorType(absl::string_view name);

// The protocol's name: kFp32 -> "FP32".
absl::string_view TensorTypeName(TensorType type);

// Bytes per element in raw contents; 0 for BYTES (length-prefixed strings).
size_t TensorTypeSize(TensorType type);

// The tensor type an embedding of `dtype` travels as.
TensorType TensorTypeOf(DType dtype);

}  // namespace temb::kserve

#endif  // TEMB_KSERVE_TENSOR_TYPE_H_
