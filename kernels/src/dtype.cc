#include "temb/kernels/dtype.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"

namespace temb {
namespace {

uint32_t FloatBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

float BitsFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Rounds a finite double to the nearest value with `precision` significant
// bits and subnormal quantum 2^(min_exponent - precision + 1), ties to even.
// The result is exact in float for both binary16 and bfloat16 parameters, so
// converting it on to the narrow format cannot round a second time.
double RoundToFormat(double value, int precision, int min_exponent) {
  if (value == 0.0 || !std::isfinite(value)) return value;
  int exponent = std::ilogb(value);
  if (exponent < min_exponent) exponent = min_exponent;
  const double quantum = std::ldexp(1.0, exponent - precision + 1);
  return std::nearbyint(value / quantum) * quantum;  // default mode: RNE
}

}  // namespace

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 4;
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kFloat64:
      return 8;
  }
  return 0;
}

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "fp32";
    case DType::kFloat16:
      return "fp16";
    case DType::kBFloat16:
      return "bf16";
    case DType::kFloat64:
      return "fp64";
  }
  return "unknown";
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  if (name == "fp32" || name == "float32") return DType::kFloat32;
  if (name == "fp16" || name == "float16") return DType::kFloat16;
  if (name == "bf16" || name == "bfloat16") return DType::kBFloat16;
  if (name == "fp64" || name == "float64") return DType::kFloat64;
  return absl::InvalidArgumentError(absl::StrCat(
      "dtype must be one of fp32, fp16, bf16, fp64, got \"", name, "\""));
}

uint16_t FloatToHalf(float value) {
  uint32_t abs_bits = FloatBits(value);
  const uint32_t sign = (abs_bits >> 16) & 0x8000u;
  abs_bits &= 0x7fffffffu;
  if (abs_bits >= 0x7f800000u) {  // inf or nan
    return static_cast<uint16_t>(sign |
                                 (abs_bits > 0x7f800000u ? 0x7e00u : 0x7c00u));
  }
  if (abs_bits >= 0x477ff000u) {  // >= 65520 rounds to infinity
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  if (abs_bits >= 0x38800000u) {  // normal half (>= 2^-14)
    const uint32_t odd = (abs_bits >> 13) & 1u;
    // Re-bias the exponent (127 -> 15) and round the 13 dropped bits to even.
    abs_bits += 0xc8000fffu + odd;
    return static_cast<uint16_t>(sign | (abs_bits >> 13));
  }
  // Subnormal half or zero: adding 0.5f aligns the mantissa so that the FPU's
  // own round-to-nearest-even drops exactly the bits below 2^-24.
  const float aligned = BitsFloat(abs_bits) + 0.5f;
  return static_cast<uint16_t>(sign | (FloatBits(aligned) - 0x3f000000u));
}

uint16_t DoubleToHalf(double value) {
  return FloatToHalf(static_cast<float>(RoundToFormat(value, 11, -14)));
}

uint16_t DoubleToBFloat16(double value) {
  const double rounded = RoundToFormat(value, 8, -126);
  if (std::fabs(rounded) > 3.3895313892515355e38) {  // beyond bf16 max
    return static_cast<uint16_t>(std::signbit(rounded) ? 0xff80u : 0x7f80u);
  }
  return static_cast<uint16_t>(FloatBits(static_cast<float>(rounded)) >> 16);
}

float HalfToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 0x1f) {
    return BitsFloat(sign | 0x7f800000u | (mantissa << 13));
  }
  return BitsFloat(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

float BFloat16ToFloat(uint16_t bits) {
  return BitsFloat(static_cast<uint32_t>(bits) << 16);
}

double ElementAsDouble(const void* data, DType dtype, int64_t index) {
  const char* p = static_cast<const char*>(data) +
                  index * static_cast<int64_t>(DTypeSize(dtype));
  switch (dtype) {
    case DType::kFloat32: {
      float v;
      std::memcpy(&v, p, sizeof v);
      return v;
    }
    case DType::kFloat16:
    case DType::kBFloat16: {
      uint16_t v;
      std::memcpy(&v, p, sizeof v);
      return dtype == DType::kFloat16 ? HalfToFloat(v) : BFloat16ToFloat(v);
    }
    case DType::kFloat64: {
      double v;
      std::memcpy(&v, p, sizeof v);
      return v;
    }
  }
  return std::numeric_limits<double>::quiet_NaN();
}

}  // namespace temb
