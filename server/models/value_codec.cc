#include "value_codec.h"

#include <cstring>

namespace temb::models {

void AppendEncoded(const float* values, int64_t count, DType dtype,
                   std::string* out) {
  // Grown once, then written in place: a 50-step plan's outputs are
  // millions of elements, and appending 2 bytes at a time cost more than
  // the conversion.
  const size_t start = out->size();
  const size_t element = dtype == DType::kFloat32 ? 4 : 2;
  out->resize(start + element * static_cast<size_t>(count));
  char* dst = out->data() + start;
  if (dtype == DType::kFloat32) {
    std::memcpy(dst, values, 4 * static_cast<size_t>(count));
    return;
  }
  if (dtype == DType::kBFloat16) {
    for (int64_t i = 0; i < count; ++i) {
      const uint16_t bits = FloatToBFloat16(values[i]);
      std::memcpy(dst + 2 * i, &bits, 2);
    }
    return;
  }
  for (int64_t i = 0; i < count; ++i) {
    const uint16_t bits = FloatToHalf(values[i]);
    std::memcpy(dst + 2 * i, &bits, 2);
  }
}

void DecodeInto(const char* bytes, int64_t count, DType dtype, float* out) {
  if (dtype == DType::kFloat32) {
    std::memcpy(out, bytes, 4 * static_cast<size_t>(count));
    return;
  }
  if (dtype == DType::kBFloat16) {
    for (int64_t i = 0; i < count; ++i) {
      // A bf16 is the upper half of a float32 (BFloat16ToFloat, inline).
      uint16_t bits;
      std::memcpy(&bits, bytes + 2 * i, 2);
      const uint32_t wide = static_cast<uint32_t>(bits) << 16;
      std::memcpy(&out[i], &wide, 4);
    }
    return;
  }
  for (int64_t i = 0; i < count; ++i) {
    uint16_t bits;
    std::memcpy(&bits, bytes + 2 * i, 2);
    out[i] = HalfToFloat(bits);
  }
}

}  // namespace temb::models
