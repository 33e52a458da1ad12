#include "temb/kernels/linear.h"

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <system_error>
#include <thread>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "temb/kernels/cpu_backend.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

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

// ---- fp32 (and widened fp16) weights -------------------------------------
//
// Float32 lanes as GCC vectors: 8 lanes (an AVX2 register, two SSE ones)
// or 16 (an AVX-512 register).  An accumulator's 16 lanes are two 8-lane
// vectors or one 16-lane vector; each engine uses the width that stays in
// its registers (wider generic vectors, or float arrays, are spilled to
// the stack on every step).  The operations per lane are the same IEEE
// ones whatever the width.
typedef float Lanes8 __attribute__((vector_size(32)));
typedef float Lanes16 __attribute__((vector_size(64)));

template <typename V>
inline __attribute__((always_inline)) V Load(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// A bf16 is the upper half of a float32.
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

// ---- bf16 weights: pairs of k in each lane --------------------------------
//
// A bf16 weight row is read as 32-element blocks, zero-padded at its end.  In
// block b, lane j (of 16) adds two products to its float32 sum, the odd
// element first: s = fma(x[32b+2j+1], w[32b+2j+1], s), then
// s = fma(x[32b+2j], w[32b+2j], s), each rounded once, with denormal inputs
// read as zero and results that are tiny after rounding flushed to zero.
// That is VDPBF16PS's definition (AVX512_BF16: two bf16 pairs per lane and
// instruction, twice the products of an fp32 FMA) whenever x holds bf16
// values, which the inputs of a bf16 model's Linears do; the other engines
// and inputs run the same FMAs under DAZ/FTZ, so every engine and every
// choice gives the same bits.  Then the 16 lanes are summed by the pairwise
// tree (lane j += lane j + width, width 8, 4, 2, 1), also flushing tiny sums.

constexpr int64_t kPairBlock = 2 * kLanes;

// The input rows in the layouts the engines read, each row padded with zeros
// to whole blocks.  `split` holds, per row and block, the 16 odd elements
// then the 16 even ones (the FMA engines' operands); `halves` holds the rows
// as bf16 in their own order (VDPBF16PS's operand), only when every value is
// a bf16.
struct PairRows {
  int64_t blocks = 0;
  std::vector<float> split;
  std::vector<uint16_t> halves;
};

bool AllBFloat16(const float* x, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, 4);
    if ((bits & 0xffffu) != 0) return false;
  }
  return true;
}

PairRows PackPairRows(const float* x, int64_t rows, int64_t in, bool halves) {
  PairRows packed;
  packed.blocks = (in + kPairBlock - 1) / kPairBlock;
  const int64_t width = packed.blocks * kPairBlock;
  if (halves) {
    packed.halves.assign(static_cast<size_t>(rows * width), 0);
    for (int64_t m = 0; m < rows; ++m) {
      for (int64_t k = 0; k < in; ++k) {
        uint32_t bits;
        std::memcpy(&bits, x + m * in + k, 4);
        packed.halves[m * width + k] = static_cast<uint16_t>(bits >> 16);
      }
    }
    return packed;
  }
  packed.split.assign(static_cast<size_t>(rows * width), 0.0f);
  for (int64_t m = 0; m < rows; ++m) {
    for (int64_t k = 0; k < in; ++k) {
      const int64_t block = k / kPairBlock, j = (k % kPairBlock) / 2;
      const int64_t slot = k % 2 == 1 ? j : kLanes + j;
      packed.split[m * width + block * kPairBlock + slot] = x[m * in + k];
    }
  }
  return packed;
}

// The weights of block `block` of `count` rows (stride `in`) with the
// elements past `in` as zeros: a full block in place, the last partial one
// copied into `pad` ([count][32]).
inline const uint16_t* WeightBlock(const uint16_t* w, int64_t in, int count,
                                   int64_t block, uint16_t* pad,
                                   int64_t* stride) {
  const int64_t k = block * kPairBlock;
  if (k + kPairBlock <= in) {
    *stride = in;
    return w + k;
  }
  std::memset(pad, 0, sizeof(uint16_t) * kPairBlock * count);
  for (int o = 0; o < count; ++o) {
    std::memcpy(pad + o * kPairBlock, w + o * in + k,
                sizeof(uint16_t) * (in - k));
  }
  *stride = kPairBlock;
  return pad;
}

// The baseline: the same operations in portable C++.  An exact product
// (float32 x bf16 fits a double), the sum rounded to odd in double and then
// to float32 with an unbounded exponent, which is one correct rounding, and
// the flush of a tiny result, as the hardware does it under FTZ.
inline float ReadAsZeroIfDenormal(float v) {
  return std::fabs(v) < FLT_MIN ? std::copysign(0.0f, v) : v;
}

inline float FlushedFma(float x, float w, float acc) {
  x = ReadAsZeroIfDenormal(x);
  w = ReadAsZeroIfDenormal(w);
  acc = ReadAsZeroIfDenormal(acc);
  const double a = acc;
  const double p = static_cast<double>(x) * static_cast<double>(w);
  double s = a + p;
  if (!std::isfinite(s)) return static_cast<float>(s);
  const double b = s - a;
  const double err = (a - (s - b)) + (p - b);
  if (err != 0) {
    uint64_t bits;
    std::memcpy(&bits, &s, 8);
    if ((bits & 1) == 0) {
      s = std::nextafter(s, err > 0 ? HUGE_VAL : -HUGE_VAL);
    }
  }
  if (std::fabs(s) >= 0x1p-100) return static_cast<float>(s);
  const float scaled = static_cast<float>(s * 0x1p64);
  if (std::fabs(scaled) < FLT_MIN * 0x1p64f) return std::copysign(0.0f, s);
  return scaled * 0x1p-64f;
}

// A sum of two flushed float32s below FLT_MIN is exact, so flushing the
// rounded sum is the hardware's FTZ.
inline float FlushedAdd(float a, float b) {
  const float s = a + b;
  return std::fabs(s) < FLT_MIN ? std::copysign(0.0f, s) : s;
}

inline float TreeSum(float* lanes) {
  for (int64_t width = kLanes / 2; width >= 1; width /= 2) {
    for (int64_t j = 0; j < width; ++j) {
      lanes[j] = FlushedAdd(lanes[j], lanes[j + width]);
    }
  }
  return lanes[0];
}

using PairSumFn = void (*)(const PairRows& x, int64_t rows, int64_t in,
                           const uint16_t* w, int64_t begin, int64_t end,
                           float* sums, int64_t stride);

void PairSumBaseline(const PairRows& x, int64_t rows, int64_t in,
                     const uint16_t* w, int64_t begin, int64_t end, float* sums,
                     int64_t stride) {
  const int64_t width = x.blocks * kPairBlock;
  uint16_t pad[kPairBlock];
  for (int64_t o = begin; o < end; ++o) {
    for (int64_t m = 0; m < rows; ++m) {
      float lanes[kLanes] = {};
      const float* row = x.split.data() + m * width;
      for (int64_t block = 0; block < x.blocks; ++block) {
        int64_t unused;
        const uint16_t* wb =
            WeightBlock(w + o * in, in, 1, block, pad, &unused);
        const float* xb = row + block * kPairBlock;
        for (int64_t j = 0; j < kLanes; ++j) {
          lanes[j] = FlushedFma(xb[j], Widen(wb[2 * j + 1]), lanes[j]);
          lanes[j] = FlushedFma(xb[kLanes + j], Widen(wb[2 * j]), lanes[j]);
        }
      }
      sums[m * stride + (o - begin)] = TreeSum(lanes);
    }
  }
}

#if defined(__x86_64__)
// Denormals read as zero and tiny results flushed (MXCSR DAZ | FTZ) while
// an engine sums; the caller's mode is restored after.
class FlushDenormals {
 public:
  FlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040u); }
  ~FlushDenormals() { _mm_setcsr(saved_); }
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

 private:
  unsigned saved_;
};

// The tree of the 16 lanes on vectors: lanes j and j + 8 are the two
// halves, then j and j + 4 the two quarters, and so on.
__attribute__((target("avx2"))) inline float TreeSum(__m256 lo, __m256 hi) {
  const __m256 eight = _mm256_add_ps(lo, hi);
  const __m128 four = _mm_add_ps(_mm256_castps256_ps128(eight),
                                 _mm256_extractf128_ps(eight, 1));
  const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
  const __m128 one = _mm_add_ss(two, _mm_shuffle_ps(two, two, 1));
  return _mm_cvtss_f32(one);
}

__attribute__((target("avx512f"))) inline float TreeSum(__m512 v) {
  const __m256 lo = _mm512_castps512_ps256(v);
  const __m256 hi =
      _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  const __m256 eight = _mm256_add_ps(lo, hi);
  const __m128 four = _mm_add_ps(_mm256_castps256_ps128(eight),
                                 _mm256_extractf128_ps(eight, 1));
  const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
  const __m128 one = _mm_add_ss(two, _mm_shuffle_ps(two, two, 1));
  return _mm_cvtss_f32(one);
}

// kRows x kOuts sums with VDPBF16PS: the weight block is loaded once for
// kRows rows and each input block once for kOuts features.
template <int kRows, int kOuts>
__attribute__((target("avx512f,avx512bf16"))) void PairTileDp(
    const uint16_t* x, int64_t x_stride, const uint16_t* w, int64_t in,
    int64_t blocks, float* sums, int64_t stride) {
  __m512 acc[kRows][kOuts];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 8
    for (int o = 0; o < kOuts; ++o) acc[r][o] = _mm512_setzero_ps();
  }
  uint16_t pad[kOuts * kPairBlock];
  for (int64_t block = 0; block < blocks; ++block) {
    int64_t w_stride;
    const uint16_t* wb = WeightBlock(w, in, kOuts, block, pad, &w_stride);
    __m512i weights[kOuts];
#pragma GCC unroll 8
    for (int o = 0; o < kOuts; ++o) {
      weights[o] = _mm512_loadu_si512(wb + o * w_stride);
    }
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      const __m512i row =
          _mm512_loadu_si512(x + r * x_stride + block * kPairBlock);
#pragma GCC unroll 8
      for (int o = 0; o < kOuts; ++o) {
        acc[r][o] =
            _mm512_dpbf16_ps(acc[r][o], (__m512bh)row, (__m512bh)weights[o]);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 8
    for (int o = 0; o < kOuts; ++o) sums[r * stride + o] = TreeSum(acc[r][o]);
  }
}

// The same sums with AVX-512F FMAs on float32 inputs: a bf16 is the upper
// half of a float32, so the odd element of a pair is the 32-bit word masked,
// the even one the word shifted up.
template <int kRows, int kOuts>
__attribute__((target("avx512f"))) void PairTileFma512(
    const float* x, int64_t x_stride, const uint16_t* w, int64_t in,
    int64_t blocks, float* sums, int64_t stride) {
  __m512 acc[kRows][kOuts];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 8
    for (int o = 0; o < kOuts; ++o) acc[r][o] = _mm512_setzero_ps();
  }
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  uint16_t pad[kOuts * kPairBlock];
  for (int64_t block = 0; block < blocks; ++block) {
    int64_t w_stride;
    const uint16_t* wb = WeightBlock(w, in, kOuts, block, pad, &w_stride);
    __m512 odd[kOuts], even[kOuts];
#pragma GCC unroll 8
    for (int o = 0; o < kOuts; ++o) {
      const __m512i words = _mm512_loadu_si512(wb + o * w_stride);
      odd[o] = _mm512_castsi512_ps(_mm512_and_si512(words, high));
      even[o] = _mm512_castsi512_ps(_mm512_slli_epi32(words, 16));
    }
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      const float* xb = x + r * x_stride + block * kPairBlock;
      const __m512 x_odd = _mm512_loadu_ps(xb);
      const __m512 x_even = _mm512_loadu_ps(xb + kLanes);
#pragma GCC unroll 8
      for (int o = 0; o < kOuts; ++o) {
        acc[r][o] = _mm512_fmadd_ps(x_odd, odd[o], acc[r][o]);
        acc[r][o] = _mm512_fmadd_ps(x_even, even[o], acc[r][o]);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 8
    for (int o = 0; o < kOuts; ++o) sums[r * stride + o] = TreeSum(acc[r][o]);
  }
}

// AVX2 with FMA: 16 lanes as two 8-lane halves.
template <int kRows, int kOuts>
__attribute__((target("avx2,fma"))) void PairTileFma256(
    const float* x, int64_t x_stride, const uint16_t* w, int64_t in,
    int64_t blocks, float* sums, int64_t stride) {
  __m256 acc[kRows][kOuts][2];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 8
    for (int o = 0; o < kOuts; ++o) {
      acc[r][o][0] = _mm256_setzero_ps();
      acc[r][o][1] = _mm256_setzero_ps();
    }
  }
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  uint16_t pad[kOuts * kPairBlock];
  for (int64_t block = 0; block < blocks; ++block) {
    int64_t w_stride;
    const uint16_t* wb = WeightBlock(w, in, kOuts, block, pad, &w_stride);
#pragma GCC unroll 2
    for (int half = 0; half < 2; ++half) {
      __m256 odd[kOuts], even[kOuts];
#pragma GCC unroll 8
      for (int o = 0; o < kOuts; ++o) {
        const __m256i words = _mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(wb + o * w_stride + half * 16));
        odd[o] = _mm256_castsi256_ps(_mm256_and_si256(words, high));
        even[o] = _mm256_castsi256_ps(_mm256_slli_epi32(words, 16));
      }
#pragma GCC unroll 8
      for (int r = 0; r < kRows; ++r) {
        const float* xb = x + r * x_stride + block * kPairBlock + half * 8;
        const __m256 x_odd = _mm256_loadu_ps(xb);
        const __m256 x_even = _mm256_loadu_ps(xb + kLanes);
#pragma GCC unroll 8
        for (int o = 0; o < kOuts; ++o) {
          acc[r][o][half] = _mm256_fmadd_ps(x_odd, odd[o], acc[r][o][half]);
          acc[r][o][half] = _mm256_fmadd_ps(x_even, even[o], acc[r][o][half]);
        }
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 8
    for (int o = 0; o < kOuts; ++o) {
      sums[r * stride + o] = TreeSum(acc[r][o][0], acc[r][o][1]);
    }
  }
}

// The tile functions of one engine, by shape.
struct DpTiles {
  template <int kRows, int kOuts>
  static void Run(const uint16_t* x, int64_t x_stride, const uint16_t* w,
                  int64_t in, int64_t blocks, float* sums, int64_t stride) {
    PairTileDp<kRows, kOuts>(x, x_stride, w, in, blocks, sums, stride);
  }
};
struct Fma512Tiles {
  template <int kRows, int kOuts>
  static void Run(const float* x, int64_t x_stride, const uint16_t* w,
                  int64_t in, int64_t blocks, float* sums, int64_t stride) {
    PairTileFma512<kRows, kOuts>(x, x_stride, w, in, blocks, sums, stride);
  }
};
struct Fma256Tiles {
  template <int kRows, int kOuts>
  static void Run(const float* x, int64_t x_stride, const uint16_t* w,
                  int64_t in, int64_t blocks, float* sums, int64_t stride) {
    PairTileFma256<kRows, kOuts>(x, x_stride, w, in, blocks, sums, stride);
  }
};

// Rows [m, rows) of features [o, o + kOuts) in tiles of kRows, the rest in
// one smaller tile.  Each (row, feature) has its own lanes and the same
// operations in any tile, so the tiling never changes a bit.
template <typename Tiles, int kRows, int kOuts, typename X>
void RowTiles(const X* x, int64_t x_stride, int64_t m, int64_t rows,
              const uint16_t* w, int64_t in, int64_t blocks, float* sums,
              int64_t stride) {
  for (; m + kRows <= rows; m += kRows) {
    Tiles::template Run<kRows, kOuts>(x + m * x_stride, x_stride, w, in, blocks,
                                      sums + m * stride, stride);
  }
  if constexpr (kRows > 1) {
    if (m < rows) {
      RowTiles<Tiles, kRows - 1, kOuts>(x, x_stride, m, rows, w, in, blocks,
                                        sums, stride);
    }
  }
}

// Features in tiles of kOuts, then one at a time; for each, every row: the
// tile's weights come from memory once for all rows (then from cache).
template <typename Tiles, int kRows, int kOuts, typename X>
void PairSumTiled(const X* x, const PairRows& pairs, int64_t rows, int64_t in,
                  const uint16_t* w, int64_t begin, int64_t end, float* sums,
                  int64_t stride) {
  FlushDenormals flush;
  const int64_t x_stride = pairs.blocks * kPairBlock;
  int64_t o = begin;
  for (; o + kOuts <= end; o += kOuts) {
    RowTiles<Tiles, kRows, kOuts>(x, x_stride, 0, rows, w + o * in, in,
                                  pairs.blocks, sums + (o - begin), stride);
  }
  for (; o < end; ++o) {
    RowTiles<Tiles, kRows, 1>(x, x_stride, 0, rows, w + o * in, in,
                              pairs.blocks, sums + (o - begin), stride);
  }
}

// Tiles per engine: rows x features accumulators plus the weight vectors
// fill the vector registers (32 for AVX-512, 16 for AVX2).
void PairSumAvx512Dp(const PairRows& x, int64_t rows, int64_t in,
                     const uint16_t* w, int64_t begin, int64_t end, float* sums,
                     int64_t stride) {
  if (rows == 1) {
    // One row (a step of a schedule) is a read of the weights: 8 weight
    // rows at a time keep more of them in flight than 4, and measured
    // 7-9% faster on the Qwen-Image slice (16 spill registers: slower).
    PairSumTiled<DpTiles, 1, 8>(x.halves.data(), x, rows, in, w, begin, end,
                                sums, stride);
    return;
  }
  PairSumTiled<DpTiles, 6, 4>(x.halves.data(), x, rows, in, w, begin, end, sums,
                              stride);
}
void PairSumAvx512(const PairRows& x, int64_t rows, int64_t in,
                   const uint16_t* w, int64_t begin, int64_t end, float* sums,
                   int64_t stride) {
  PairSumTiled<Fma512Tiles, 4, 4>(x.split.data(), x, rows, in, w, begin, end,
                                  sums, stride);
}
void PairSumAvx2(const PairRows& x, int64_t rows, int64_t in, const uint16_t* w,
                 int64_t begin, int64_t end, float* sums, int64_t stride) {
  PairSumTiled<Fma256Tiles, 2, 2>(x.split.data(), x, rows, in, w, begin, end,
                                  sums, stride);
}

// AVX512_BF16 (CPUID leaf 7, subleaf 1, EAX bit 5), read directly: older
// compilers do not know the name in __builtin_cpu_supports.
bool HasAvx512Bf16() {
  unsigned eax, ebx, ecx, edx;
  return __builtin_cpu_supports("avx512f") &&
         __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) &&
         (eax & (1u << 5)) != 0;
}
#endif  // __x86_64__

// The engine for `isa` and whether it reads `halves` (VDPBF16PS, for inputs
// that are all bf16 values) or `split`.
PairSumFn PairSumFor(CpuIsa isa, bool x_is_bf16, bool* halves) {
  *halves = false;
#if defined(__x86_64__)
  switch (isa) {
    case CpuIsa::kAvx512:
      if (x_is_bf16 && HasAvx512Bf16()) {
        *halves = true;
        return PairSumAvx512Dp;
      }
      return PairSumAvx512;
    case CpuIsa::kAvx2:
      return PairSumAvx2;
    default:
      break;
  }
#else
  (void)isa;
  (void)x_is_bf16;
#endif
  return PairSumBaseline;
}

// FloatToBFloat16 then back, inline (it runs once per output element):
// round to nearest even, a NaN stays a quiet NaN.
inline float RoundToBFloat16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    bits |= 0x00400000u;
  } else {
    bits += 0x7fffu + ((bits >> 16) & 1u);
  }
  bits &= 0xffff0000u;
  float rounded;
  std::memcpy(&rounded, &bits, 4);
  return rounded;
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

absl::Status LinearForward(const LinearWeights& params,
                           absl::Span<const float> x, int64_t rows,
                           DType out_dtype, int threads,
                           absl::Span<float> out) {
  return LinearForwardOnIsa(DefaultCpuIsa(), params, x, rows, out_dtype,
                            threads, out);
}

absl::Status LinearForwardOnIsa(CpuIsa isa, const LinearWeights& params,
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
  // bf16 weights: the inputs packed once for every thread.
  PairRows pairs;
  PairSumFn sum_bf16 = nullptr;
  if (dtype == DType::kBFloat16) {
    bool halves = false;
    sum_bf16 = PairSumFor(isa, AllBFloat16(input, rows * in), &halves);
    pairs = PackPairRows(input, rows, in, halves);
  }
  const SumRangeFn<float> sum_f32 = SumRangeFor<float>(isa);
  const int64_t chunks =
      (out_features + kFeaturesPerChunk - 1) / kFeaturesPerChunk;
  // Work comes in chunks of output features: a chunk's weights are read
  // once for all input rows, and every output element is summed by one
  // thread alone, so which thread takes which chunk changes no bit.
  auto compute_chunk = [&](int64_t chunk) {
    const int64_t begin = chunk * kFeaturesPerChunk;
    const int64_t end = std::min(out_features, begin + kFeaturesPerChunk);
    float* sums = output + begin;
    if (dtype == DType::kBFloat16) {
      sum_bf16(pairs, rows, in, reinterpret_cast<const uint16_t*>(weight),
               begin, end, sums, out_features);
    } else {
      const float* w = dtype == DType::kFloat32
                           ? reinterpret_cast<const float*>(weight)
                           : widened.data();
      sum_f32(input, rows, in, w, begin, end, sums, out_features);
    }
    // The bias, widened once per chunk, then one rounding.
    float bias_values[kFeaturesPerChunk];
    for (int64_t o = begin; o < end; ++o) {
      bias_values[o - begin] =
          bias != nullptr ? WeightAt(bias, dtype, o) : 0.0f;
    }
    for (int64_t m = 0; m < rows; ++m) {
      float* row = output + m * out_features;
      for (int64_t o = begin; o < end; ++o) {
        const float sum =
            bias != nullptr ? row[o] + bias_values[o - begin] : row[o];
        row[o] = out_dtype == DType::kBFloat16 ? RoundToBFloat16(sum)
                                               : RoundToDType(sum, out_dtype);
      }
    }
  };
  // Threads take the next chunk from a shared counter and the caller waits
  // for them blocked in join(), never spinning: on a machine shared with
  // other work a spinning waiter takes the core its preempted partner needs
  // (an OpenMP loop here took twice as long on a loaded 2-core machine).
  std::atomic<int64_t> next{0};
  auto work = [&] {
    for (int64_t chunk = next.fetch_add(1); chunk < chunks;
         chunk = next.fetch_add(1)) {
      compute_chunk(chunk);
    }
  };
  std::vector<std::thread> helpers;
  const int64_t extra = std::min<int64_t>(threads, chunks) - 1;
  for (int64_t i = 0; i < extra; ++i) {
    try {
      helpers.emplace_back(work);
    } catch (const std::system_error&) {
      break;  // fewer threads: the same result, later
    }
  }
  work();
  for (std::thread& helper : helpers) helper.join();
  return absl::OkStatus();
}

namespace {

class CpuLinearEngine final : public LinearEngine {
 public:
  explicit CpuLinearEngine(int threads) : threads_(threads) {}

  absl::StatusOr<int> Upload(const LinearWeights& weights) override {
    if (weights.dtype == DType::kFloat64 || weights.in_features < 1 ||
        weights.out_features < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "linear: an fp32, bf16 or fp16 Linear of at least one feature "
          "each way is required, got ",
          DTypeName(weights.dtype), " [", weights.out_features, ", ",
          weights.in_features, "]"));
    }
    absl::MutexLock lock(&mutex_);
    linears_.push_back(weights);
    return static_cast<int>(linears_.size() - 1);
  }

  absl::Status Forward(int id, absl::Span<const float> x, int64_t rows,
                       DType out_dtype, absl::Span<float> out) override {
    LinearWeights weights;
    {
      absl::MutexLock lock(&mutex_);
      if (id < 0 || id >= static_cast<int>(linears_.size())) {
        return absl::InvalidArgumentError(
            absl::StrCat("linear: no Linear of id ", id));
      }
      weights = linears_[id];
    }
    return LinearForward(weights, x, rows, out_dtype, threads_, out);
  }

  std::string name() const override { return "cpu"; }
  int64_t device_bytes() const override { return 0; }
  bool copies_weights() const override { return false; }

 private:
  const int threads_;
  absl::Mutex mutex_;
  std::vector<LinearWeights> linears_;  // borrowed spans
};

}  // namespace

std::unique_ptr<LinearEngine> CreateCpuLinearEngine(int threads) {
  return std::make_unique<CpuLinearEngine>(threads);
}

}  // namespace temb
