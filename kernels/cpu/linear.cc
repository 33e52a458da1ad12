#include "temb/kernels/linear.h"

#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"

namespace temb {
namespace {

// Lanes of partial sums.  Fixed: changing it changes every result's bits.
constexpr int64_t kLanes = 16;

float WeightAt(const uint8_t* data, DType dtype, int64_t index) {
  switch (dtype) {
    case DType::kBFloat16: {
      uint16_t bits;
      std::memcpy(&bits, data + 2 * index, 2);
      return BFloat16ToFloat(bits);
    }
    case DType::kFloat16: {
      uint16_t bits;
      std::memcpy(&bits, data + 2 * index, 2);
      return HalfToFloat(bits);
    }
    default: {
      float value;
      std::memcpy(&value, data + 4 * index, 4);
      return value;
    }
  }
}

// Widens `count` weights starting at `index` into `dst`.  bf16 is a shift
// of the bits, which the compiler vectorises.
void WidenWeights(const uint8_t* data, DType dtype, int64_t index,
                  int64_t count, float* dst) {
  if (dtype == DType::kFloat32) {
    std::memcpy(dst, data + 4 * index, 4 * count);
    return;
  }
  if (dtype == DType::kBFloat16) {
    const uint8_t* src = data + 2 * index;
    for (int64_t j = 0; j < count; ++j) {
      uint16_t bits;
      std::memcpy(&bits, src + 2 * j, 2);
      const uint32_t wide = static_cast<uint32_t>(bits) << 16;
      std::memcpy(&dst[j], &wide, 4);
    }
    return;
  }
  for (int64_t j = 0; j < count; ++j) dst[j] = WeightAt(data, dtype, index + j);
}

// The fixed-order dot product of one input row with one (widened) weight
// row.
float Dot(const float* x, const float* w, int64_t k_total) {
  float acc[kLanes] = {};
  int64_t k = 0;
  for (; k + kLanes <= k_total; k += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) acc[j] += x[k + j] * w[k + j];
  }
  for (int64_t j = 0; k + j < k_total; ++j) acc[j] += x[k + j] * w[k + j];
  for (int64_t width = kLanes / 2; width >= 1; width /= 2) {
    for (int64_t j = 0; j < width; ++j) acc[j] += acc[j + width];
  }
  return acc[0];
}

}  // namespace

float RoundToDType(float value, DType dtype) {
  switch (dtype) {
    case DType::kBFloat16:
      return BFloat16ToFloat(FloatToBFloat16(value));
    case DType::kFloat16:
      return HalfToFloat(FloatToHalf(value));
    default:
      return value;
  }
}

absl::Status LinearForward(const LinearParams& params,
                           absl::Span<const float> x, int64_t rows,
                           DType out_dtype, int threads,
                           absl::Span<float> out) {
  if (params.dtype == DType::kFloat64 || out_dtype == DType::kFloat64) {
    return absl::InvalidArgumentError(
        "linear: dtype must be fp32, bf16 or fp16, got fp64");
  }
  if (threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("linear: threads must be >= 1, got ", threads));
  }
  const int64_t in = params.in_features;
  const int64_t out_features = params.out_features;
  const int64_t element = static_cast<int64_t>(DTypeSize(params.dtype));
  if (in < 1 || out_features < 1 || rows < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "linear: in_features, out_features must be >= 1 and rows >= 0, got ",
        in, ", ", out_features, ", ", rows));
  }
  if (static_cast<int64_t>(params.weight.size()) !=
      in * out_features * element) {
    return absl::InvalidArgumentError(
        absl::StrCat("linear: weight has ", params.weight.size(),
                     " bytes, expected ", in * out_features * element));
  }
  if (!params.bias.empty() &&
      static_cast<int64_t>(params.bias.size()) != out_features * element) {
    return absl::InvalidArgumentError(
        absl::StrCat("linear: bias has ", params.bias.size(),
                     " bytes, expected ", out_features * element));
  }
  if (static_cast<int64_t>(x.size()) != rows * in) {
    return absl::InvalidArgumentError(absl::StrCat(
        "linear: input has ", x.size(), " values, expected ", rows * in));
  }
  if (static_cast<int64_t>(out.size()) != rows * out_features) {
    return absl::InvalidArgumentError(
        absl::StrCat("linear: output has ", out.size(), " values, expected ",
                     rows * out_features));
  }
  if (rows == 0) return absl::OkStatus();

  const uint8_t* weight = params.weight.data();
  const uint8_t* bias = params.bias.empty() ? nullptr : params.bias.data();
  const DType dtype = params.dtype;
  const float* input = x.data();
  float* output = out.data();
  // Each thread owns whole output features: a weight row is widened once
  // and reused for every input row while it is in cache.
#pragma omp parallel num_threads(threads)
  {
    std::unique_ptr<float[]> widened(new float[in]);
#pragma omp for schedule(static)
    for (int64_t o = 0; o < out_features; ++o) {
      WidenWeights(weight, dtype, o * in, in, widened.get());
      const float b = bias == nullptr ? 0.0f : WeightAt(bias, dtype, o);
      for (int64_t m = 0; m < rows; ++m) {
        float sum = Dot(input + m * in, widened.get(), in);
        if (bias != nullptr) sum += b;
        output[m * out_features + o] = RoundToDType(sum, out_dtype);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace temb
