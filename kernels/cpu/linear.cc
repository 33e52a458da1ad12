#include "temb/kernels/linear.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "temb/kernels/cpu_backend.h"

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

// Float32 lanes as GCC vectors: 8 lanes (an AVX2 register, two SSE ones)
// or 16 (an AVX-512 register).  An accumulator's 16 lanes are two 8-lane
// vectors or one 16-lane vector; each engine uses the width that stays in
// its registers (wider generic vectors, or float arrays, are spilled to
// the stack on every step).  The operations per lane are the same IEEE
// ones whatever the width.
typedef float Lanes8 __attribute__((vector_size(32)));
typedef uint32_t Bits8 __attribute__((vector_size(32)));
typedef uint16_t Half8 __attribute__((vector_size(16)));
typedef float Lanes16 __attribute__((vector_size(64)));
typedef uint32_t Bits16 __attribute__((vector_size(64)));
typedef uint16_t Half16 __attribute__((vector_size(32)));

template <typename V>
struct VectorTraits;
template <>
struct VectorTraits<Lanes8> {
  using Bits = Bits8;
  using Half = Half8;
};
template <>
struct VectorTraits<Lanes16> {
  using Bits = Bits16;
  using Half = Half16;
};

template <typename V>
inline __attribute__((always_inline)) V Load(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// bf16 weights as float32: a bf16 is the upper half of a float32.
template <typename V>
inline __attribute__((always_inline)) V Load(const uint16_t* p) {
  using Bits = typename VectorTraits<V>::Bits;
  typename VectorTraits<V>::Half h;
  std::memcpy(&h, p, sizeof h);
  const Bits bits = __builtin_convertvector(h, Bits) << 16;
  // A cast between vectors of one size reinterprets the bits.
  return (V)bits;
}

inline float Widen(uint16_t bf16_bits) {
  const uint32_t wide = static_cast<uint32_t>(bf16_bits) << 16;
  float value;
  std::memcpy(&value, &wide, 4);
  return value;
}
inline float Widen(float value) { return value; }

// The dot products of kRows input rows (stride `in`) with kOuts weight rows
// (stride `in`), each in the fixed order of linear.h: lane j sums
// x[k + j] * w[k + j] over k = 0, 16, 32, ...; the tail goes to lanes 0..;
// then a pairwise tree.  Every (row, output) pair has its own accumulator
// and the same operations whatever the tile, so the tile shape (chosen per
// instruction set for speed) never changes a bit.  sums[r * stride + o].
template <typename V, int kRows, int kOuts, typename W>
inline __attribute__((always_inline)) void DotTile(const float* x, const W* w,
                                                   int64_t in, float* sums,
                                                   int64_t stride) {
  constexpr int kWidth = sizeof(V) / sizeof(float);
  constexpr int kParts = kLanes / kWidth;
  V acc[kRows][kOuts][kParts] = {};
  int64_t k = 0;
  for (; k + kLanes <= in; k += kLanes) {
    V weights[kOuts][kParts];
    for (int o = 0; o < kOuts; ++o) {
      for (int p = 0; p < kParts; ++p) {
        weights[o][p] = Load<V>(w + o * in + k + p * kWidth);
      }
    }
    for (int r = 0; r < kRows; ++r) {
      for (int p = 0; p < kParts; ++p) {
        const V row = Load<V>(x + r * in + k + p * kWidth);
        for (int o = 0; o < kOuts; ++o) acc[r][o][p] += row * weights[o][p];
      }
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int o = 0; o < kOuts; ++o) {
      float lanes[kLanes];
      std::memcpy(lanes, acc[r][o], sizeof lanes);
      for (int64_t j = 0; k + j < in; ++j) {
        lanes[j] += x[r * in + k + j] * Widen(w[o * in + k + j]);
      }
      for (int64_t width = kLanes / 2; width >= 1; width /= 2) {
        for (int64_t j = 0; j < width; ++j) lanes[j] += lanes[j + width];
      }
      sums[r * stride + o] = lanes[0];
    }
  }
}

// Raw sums (no bias, no rounding) of output features [begin, end) for every
// row into sums[row * stride + (o - begin)], in tiles of kRows x kOuts and
// then single rows and features for the remainders.
template <typename V, typename VSingle, int kRows, int kOuts, typename W>
inline __attribute__((always_inline)) void SumRange(const float* x,
                                                    int64_t rows, int64_t in,
                                                    const W* w, int64_t begin,
                                                    int64_t end, float* sums,
                                                    int64_t stride) {
  int64_t o = begin;
  for (; o + kOuts <= end; o += kOuts) {
    int64_t m = 0;
    for (; m + kRows <= rows; m += kRows) {
      DotTile<V, kRows, kOuts>(x + m * in, w + o * in, in,
                               sums + m * stride + (o - begin), stride);
    }
    // Rows left over: one weight row at a time, which streams memory
    // faster than several when a single input row has little to reuse.
    for (; m < rows; ++m) {
      for (int p = 0; p < kOuts; ++p) {
        DotTile<VSingle, 1, 1>(x + m * in, w + (o + p) * in, in,
                               sums + m * stride + (o + p - begin), stride);
      }
    }
  }
  for (; o < end; ++o) {
    for (int64_t m = 0; m < rows; ++m) {
      DotTile<VSingle, 1, 1>(x + m * in, w + o * in, in,
                             sums + m * stride + (o - begin), stride);
    }
  }
}

// One entry per instruction set, each the same source with the tile that
// fits its registers (AVX-512 with VL: 32 of 8 lanes; AVX2: 16 of 8; SSE2:
// 16 of 4).  No contraction into fused multiply-adds (-ffp-contract=off): the
// three run the same float32 operations and give the same bits.
template <typename W>
using SumRangeFn = void (*)(const float*, int64_t, int64_t, const W*, int64_t,
                            int64_t, float*, int64_t);

template <typename W>
__attribute__((target("avx512f"))) void SumRangeAvx512(
    const float* x, int64_t rows, int64_t in, const W* w, int64_t begin,
    int64_t end, float* sums, int64_t stride) {
  SumRange<Lanes16, Lanes8, 4, 4>(x, rows, in, w, begin, end, sums, stride);
}

template <typename W>
__attribute__((target("avx2"))) void SumRangeAvx2(const float* x, int64_t rows,
                                                  int64_t in, const W* w,
                                                  int64_t begin, int64_t end,
                                                  float* sums, int64_t stride) {
  SumRange<Lanes8, Lanes8, 4, 1>(x, rows, in, w, begin, end, sums, stride);
}

template <typename W>
void SumRangeBaseline(const float* x, int64_t rows, int64_t in, const W* w,
                      int64_t begin, int64_t end, float* sums, int64_t stride) {
  SumRange<Lanes8, Lanes8, 2, 1>(x, rows, in, w, begin, end, sums, stride);
}

template <typename W>
SumRangeFn<W> SumRangeFor(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512:
      return SumRangeAvx512<W>;
    case CpuIsa::kAvx2:
      return SumRangeAvx2<W>;
    default:
      return SumRangeBaseline<W>;
  }
}

// Output features per unit of work: enough to amortise a tile's setup,
// few enough to balance threads on the narrow embedder Linears.
constexpr int64_t kFeaturesPerChunk = 64;

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
  return LinearForwardOnIsa(DefaultCpuIsa(), params, x, rows, out_dtype,
                            threads, out);
}

absl::Status LinearForwardOnIsa(CpuIsa isa, const LinearParams& params,
                                absl::Span<const float> x, int64_t rows,
                                DType out_dtype, int threads,
                                absl::Span<float> out) {
  const std::vector<CpuIsa> supported = SupportedCpuIsas();
  if (std::find(supported.begin(), supported.end(), isa) == supported.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "linear: this CPU cannot run the ", CpuIsaName(isa), " engine"));
  }
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
  // fp16 weights are widened to float32 once (rare: diffusers stores fp32
  // or bf16); bf16 and fp32 are read in place.
  std::vector<float> widened;
  if (dtype == DType::kFloat16) {
    widened.resize(static_cast<size_t>(in * out_features));
    for (int64_t i = 0; i < in * out_features; ++i) {
      widened[i] = WeightAt(weight, dtype, i);
    }
  }
  const SumRangeFn<uint16_t> sum_bf16 = SumRangeFor<uint16_t>(isa);
  const SumRangeFn<float> sum_f32 = SumRangeFor<float>(isa);
  const int64_t chunks =
      (out_features + kFeaturesPerChunk - 1) / kFeaturesPerChunk;
  // Each thread owns whole chunks of output features: a chunk's weights are
  // read once for all input rows, and every output element is summed by
  // one thread alone.
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const int64_t begin = chunk * kFeaturesPerChunk;
    const int64_t end = std::min(out_features, begin + kFeaturesPerChunk);
    float* sums = output + begin;
    if (dtype == DType::kBFloat16) {
      sum_bf16(input, rows, in, reinterpret_cast<const uint16_t*>(weight),
               begin, end, sums, out_features);
    } else {
      const float* w = dtype == DType::kFloat32
                           ? reinterpret_cast<const float*>(weight)
                           : widened.data();
      sum_f32(input, rows, in, w, begin, end, sums, out_features);
    }
    for (int64_t m = 0; m < rows; ++m) {
      for (int64_t o = begin; o < end; ++o) {
        float sum = output[m * out_features + o];
        if (bias != nullptr) sum += WeightAt(bias, dtype, o);
        output[m * out_features + o] = RoundToDType(sum, out_dtype);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace temb
