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

// Eight float32 lanes as a GCC vector: AVX2 registers in the AVX2 clone,
// pairs of SSE registers in the baseline one, the same IEEE operations in
// both.  Accumulators held in these stay in registers, where a float array
// would be spilled to the stack on every step.
typedef float Lanes8 __attribute__((vector_size(32)));
typedef uint32_t Bits8 __attribute__((vector_size(32)));
typedef uint16_t Half8 __attribute__((vector_size(16)));

inline __attribute__((always_inline)) Lanes8 Load8(const float* p) {
  Lanes8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Eight bf16 weights as float32: a bf16 is the upper half of a float32.
inline __attribute__((always_inline)) Lanes8 Load8(const uint16_t* p) {
  Half8 h;
  std::memcpy(&h, p, sizeof h);
  const Bits8 bits = __builtin_convertvector(h, Bits8) << 16;
  // A cast between vectors of one size reinterprets the bits.
  return (Lanes8)bits;
}

inline float Widen(uint16_t bf16_bits) {
  const uint32_t wide = static_cast<uint32_t>(bf16_bits) << 16;
  float value;
  std::memcpy(&value, &wide, 4);
  return value;
}
inline float Widen(float value) { return value; }

// Dot products of kRows input rows with one weight row, each in the fixed
// order of the file comment in linear.h: lane j of row r sums x[r][k + j] *
// w[k + j] over k = 0, 16, 32, ... (lanes 0-7 in `low`, 8-15 in `high`);
// the tail goes to lanes 0..; then a pairwise tree.  Rows never mix, so a
// row gives the same bits through the one-row and the four-row variant.
template <int kRows, typename W>
inline __attribute__((always_inline)) void DotRows(const float* const* x,
                                                   const W* w, int64_t k_total,
                                                   float* sums) {
  Lanes8 low[kRows] = {};
  Lanes8 high[kRows] = {};
  int64_t k = 0;
  for (; k + kLanes <= k_total; k += kLanes) {
    const Lanes8 w_low = Load8(w + k);
    const Lanes8 w_high = Load8(w + k + 8);
    for (int r = 0; r < kRows; ++r) {
      low[r] += Load8(x[r] + k) * w_low;
      high[r] += Load8(x[r] + k + 8) * w_high;
    }
  }
  for (int r = 0; r < kRows; ++r) {
    float acc[kLanes];
    std::memcpy(acc, &low[r], sizeof low[r]);
    std::memcpy(acc + 8, &high[r], sizeof high[r]);
    for (int64_t j = 0; k + j < k_total; ++j) {
      acc[j] += x[r][k + j] * Widen(w[k + j]);
    }
    for (int64_t width = kLanes / 2; width >= 1; width /= 2) {
      for (int64_t j = 0; j < width; ++j) acc[j] += acc[j + width];
    }
    sums[r] = acc[0];
  }
}

// One output feature for every row: rows four at a time (each weight
// element loaded once for four rows), then one at a time.  Compiled for
// AVX2 and for the baseline; without contraction (-ffp-contract=off) both
// run the same float32 operations, so the bits do not depend on the CPU.
template <typename W>
inline __attribute__((always_inline)) void FeatureForRows(
    const float* x, int64_t rows, int64_t in, const W* w, float* sums) {
  int64_t m = 0;
  for (; m + 4 <= rows; m += 4) {
    const float* block[4] = {x + m * in, x + (m + 1) * in, x + (m + 2) * in,
                             x + (m + 3) * in};
    DotRows<4>(block, w, in, sums + m);
  }
  for (; m < rows; ++m) {
    const float* row[1] = {x + m * in};
    DotRows<1>(row, w, in, sums + m);
  }
}

__attribute__((target_clones("avx2", "default"))) void FeatureForRowsBf16(
    const float* x, int64_t rows, int64_t in, const uint16_t* w, float* sums) {
  FeatureForRows(x, rows, in, w, sums);
}

__attribute__((target_clones("avx2", "default"))) void FeatureForRowsF32(
    const float* x, int64_t rows, int64_t in, const float* w, float* sums) {
  FeatureForRows(x, rows, in, w, sums);
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
  // The weights are read as elements of their dtype in place.
  if (reinterpret_cast<uintptr_t>(params.weight.data()) % element != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("linear: weight must be aligned to its element size (",
                     element, " bytes)"));
  }
  if (rows == 0) return absl::OkStatus();

  const uint8_t* weight = params.weight.data();
  const uint8_t* bias = params.bias.empty() ? nullptr : params.bias.data();
  const DType dtype = params.dtype;
  const float* input = x.data();
  float* output = out.data();
  // Each thread owns whole output features; a feature's weight row is read
  // once for all input rows.
#pragma omp parallel num_threads(threads)
  {
    std::unique_ptr<float[]> sums(new float[rows]);
    // fp16 weights are widened to float32 first (rare: diffusers stores
    // fp32 or bf16).
    std::unique_ptr<float[]> widened(dtype == DType::kFloat16 ? new float[in]
                                                              : nullptr);
#pragma omp for schedule(static)
    for (int64_t o = 0; o < out_features; ++o) {
      if (dtype == DType::kBFloat16) {
        FeatureForRowsBf16(input, rows, in,
                           reinterpret_cast<const uint16_t*>(weight) + o * in,
                           sums.get());
      } else if (dtype == DType::kFloat32) {
        FeatureForRowsF32(input, rows, in,
                          reinterpret_cast<const float*>(weight) + o * in,
                          sums.get());
      } else {
        for (int64_t k = 0; k < in; ++k) {
          widened[k] = WeightAt(weight, dtype, o * in + k);
        }
        FeatureForRowsF32(input, rows, in, widened.get(), sums.get());
      }
      const float b = bias == nullptr ? 0.0f : WeightAt(bias, dtype, o);
      for (int64_t m = 0; m < rows; ++m) {
        float sum = sums[m];
        if (bias != nullptr) sum += b;
        output[m * out_features + o] = RoundToDType(sum, out_dtype);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace temb
