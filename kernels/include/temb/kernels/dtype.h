// Output element types and their exact conversions.
//
// fp16 and bf16 outputs are the wider value rounded to nearest, ties to even,
// exactly as PyTorch's `.to(torch.float16/bfloat16)` does.  Inputs to these
// functions are always finite (the service rejects non-finite timesteps and
// the kernels only produce values in [-1, 1] or the timesteps themselves).
#ifndef TEMB_KERNELS_DTYPE_H_
#define TEMB_KERNELS_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace temb {

enum class DType : uint8_t {
  kFloat32 = 0,
  kFloat16 = 1,
  kBFloat16 = 2,
  kFloat64 = 3,
};

// Bytes per element: 4, 2, 2, 8.
size_t DTypeSize(DType dtype);

// Canonical lower-case name: "fp32", "fp16", "bf16", "fp64".
absl::string_view DTypeName(DType dtype);

// Parses a canonical name (also accepts "float32", "float16", "bfloat16",
// "float64").  INVALID_ARGUMENT naming the accepted values otherwise.
absl::StatusOr<DType> ParseDType(absl::string_view name);

// Round-to-nearest-even conversions (bit patterns of IEEE binary16/bfloat16).
uint16_t FloatToHalf(float value);
uint16_t DoubleToHalf(double value);      // rounds once, from double
uint16_t DoubleToBFloat16(double value);  // rounds once, from double
float HalfToFloat(uint16_t bits);
float BFloat16ToFloat(uint16_t bits);

// Inline and branch-free, so that loops over outputs vectorise: a model's
// 50-step plan encodes millions of values.  NaN stays a quiet NaN.
inline uint16_t FloatToBFloat16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x0040u;
  return static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? quiet_nan
                                                                  : rounded);
}

// Element `index` of a little-endian buffer of `dtype`, widened to double
// (exactly: every dtype here is a subset of double).  For readers of
// outputs: the CLI's printer, tests, fuzzers.
double ElementAsDouble(const void* data, DType dtype, int64_t index);

}  // namespace temb

#endif  // TEMB_KERNELS_DTYPE_H_
