#include "temb/kserve/tensor_type.h"

namespace temb::kserve {
namespace {

struct Entry {
  TensorType type;
  absl::string_view name;
  size_t size;
};

constexpr Entry kTypes[] = {
    {TensorType::kBool, "BOOL", 1},     {TensorType::kUint8, "UINT8", 1},
    {TensorType::kUint16, "UINT16", 2}, {TensorType::kUint32, "UINT32", 4},
    {TensorType::kUint64, "UINT64", 8}, {TensorType::kInt8, "INT8", 1},
    {TensorType::kInt16, "INT16", 2},   {TensorType::kInt32, "INT32", 4},
    {TensorType::kInt64, "INT64", 8},   {TensorType::kFp16, "FP16", 2},
    {TensorType::kBf16, "BF16", 2},     {TensorType::kFp32, "FP32", 4},
    {TensorType::kFp64, "FP64", 8},     {TensorType::kBytes, "BYTES", 0},
};

const Entry& EntryOf(TensorType type) {
  return kTypes[static_cast<size_t>(type)];
}

}  // namespace

std::optional<TensorType> ParseTensorType(absl::string_view name) {
  for (const Entry& entry : kTypes) {
    if (entry.name == name) return entry.type;
  }
  return std::nullopt;
}

absl::string_view TensorTypeName(TensorType type) { return EntryOf(type).name; }

size_t TensorTypeSize(TensorType type) { return EntryOf(type).size; }

TensorType TensorTypeOf(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return TensorType::kFp32;
    case DType::kFloat16:
      return TensorType::kFp16;
    case DType::kBFloat16:
      return TensorType::kBf16;
    case DType::kFloat64:
      return TensorType::kFp64;
  }
  return TensorType::kFp32;
}

}  // namespace temb::kserve
