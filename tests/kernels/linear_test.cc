// The CPU Linear: values against a float64 evaluation, rounding to the
// output dtype, and batch invariance (a row's bits do not depend on the
// other rows nor on the thread count).
#include "temb/kernels/linear.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace temb {
namespace {

struct Layer {
  std::vector<uint8_t> weight;
  std::vector<uint8_t> bias;
  std::vector<double> weight_values;  // the stored values, widened
  std::vector<double> bias_values;
  LinearWeights params;
};

Layer RandomLayer(DType dtype, int64_t in, int64_t out, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  Layer layer;
  auto append = [&](std::vector<uint8_t>* bytes, std::vector<double>* values) {
    const float v = uniform(rng) / std::sqrt(static_cast<float>(in));
    if (dtype == DType::kFloat32) {
      const uint8_t* p = reinterpret_cast<const uint8_t*>(&v);
      bytes->insert(bytes->end(), p, p + 4);
      values->push_back(v);
    } else {
      const uint16_t bits = FloatToBFloat16(v);
      const uint8_t* p = reinterpret_cast<const uint8_t*>(&bits);
      bytes->insert(bytes->end(), p, p + 2);
      values->push_back(BFloat16ToFloat(bits));
    }
  };
  for (int64_t i = 0; i < in * out; ++i) {
    append(&layer.weight, &layer.weight_values);
  }
  for (int64_t i = 0; i < out; ++i) append(&layer.bias, &layer.bias_values);
  layer.params.dtype = dtype;
  layer.params.in_features = in;
  layer.params.out_features = out;
  return layer;
}

std::vector<float> RandomRows(int64_t rows, int64_t in, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> x(rows * in);
  for (float& v : x) v = normal(rng);
  return x;
}

std::vector<float> Forward(Layer& layer, const std::vector<float>& x,
                           int64_t rows, DType out_dtype, int threads) {
  layer.params.weight = layer.weight;
  layer.params.bias = layer.bias;
  std::vector<float> out(rows * layer.params.out_features);
  const absl::Status status = LinearForward(layer.params, x, rows, out_dtype,
                                            threads, absl::MakeSpan(out));
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

TEST(LinearTest, Float32CloseToFloat64) {
  constexpr int64_t kIn = 3072, kOut = 40, kRows = 3;
  Layer layer = RandomLayer(DType::kFloat32, kIn, kOut, 1);
  const std::vector<float> x = RandomRows(kRows, kIn, 2);
  const std::vector<float> out = Forward(layer, x, kRows, DType::kFloat32, 2);
  for (int64_t m = 0; m < kRows; ++m) {
    for (int64_t o = 0; o < kOut; ++o) {
      double exact = layer.bias_values[o];
      double magnitude = std::abs(exact);
      for (int64_t k = 0; k < kIn; ++k) {
        const double term = x[m * kIn + k] * layer.weight_values[o * kIn + k];
        exact += term;
        magnitude += std::abs(term);
      }
      // 16 lanes of ~kIn/16 sums, then a 4-level tree: a bound of
      // (kIn/16 + 5) * 2^-24 * sum |terms|.
      EXPECT_NEAR(out[m * kOut + o], exact,
                  (kIn / 16.0 + 5) * std::ldexp(1.0, -24) * magnitude)
          << m << "," << o;
    }
  }
}

TEST(LinearTest, Bf16OutputIsTheFloat32SumRounded) {
  constexpr int64_t kIn = 100, kOut = 17, kRows = 4;
  Layer layer = RandomLayer(DType::kBFloat16, kIn, kOut, 3);
  const std::vector<float> x = RandomRows(kRows, kIn, 4);
  const std::vector<float> wide = Forward(layer, x, kRows, DType::kFloat32, 1);
  const std::vector<float> narrow =
      Forward(layer, x, kRows, DType::kBFloat16, 1);
  for (size_t i = 0; i < wide.size(); ++i) {
    EXPECT_EQ(narrow[i], BFloat16ToFloat(FloatToBFloat16(wide[i]))) << i;
  }
}

std::vector<float> ForwardOn(CpuIsa isa, Layer& layer,
                             const std::vector<float>& x, int64_t rows,
                             DType out_dtype, int threads) {
  layer.params.weight = layer.weight;
  layer.params.bias = layer.bias;
  std::vector<float> out(rows * layer.params.out_features);
  const absl::Status status = LinearForwardOnIsa(
      isa, layer.params, x, rows, out_dtype, threads, absl::MakeSpan(out));
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

// bf16 weights: 16 lanes of pairs of products, each an FMA, over
// ceil(in / 32) blocks, then a 4-level tree: every term passes through at
// most 2 * blocks + 4 roundings of 2^-24.
TEST(LinearTest, Bf16WeightsCloseToFloat64OnEveryEngine) {
  constexpr int64_t kIn = 3072, kOut = 48, kRows = 5;
  Layer layer = RandomLayer(DType::kBFloat16, kIn, kOut, 11);
  // Dense inputs: bf16 values (as a bf16 model's Linears get them) and, in
  // the last row, arbitrary float32 ones.
  std::vector<float> x = RandomRows(kRows, kIn, 12);
  for (int64_t i = 0; i < (kRows - 1) * kIn; ++i) {
    x[i] = BFloat16ToFloat(FloatToBFloat16(x[i]));
  }
  const double bound_terms = 2.0 * ((kIn + 31) / 32) + 4;
  for (CpuIsa isa : SupportedCpuIsas()) {
    const std::vector<float> out =
        ForwardOn(isa, layer, x, kRows, DType::kFloat32, 2);
    for (int64_t m = 0; m < kRows; ++m) {
      for (int64_t o = 0; o < kOut; ++o) {
        double exact = 0, magnitude = 0;
        for (int64_t k = 0; k < kIn; ++k) {
          const double term = x[m * kIn + k] * layer.weight_values[o * kIn + k];
          exact += term;
          magnitude += std::abs(term);
        }
        // The bias is added to the float32 sum: one more rounding.
        const double sum_bound = bound_terms * std::ldexp(1.0, -24) * magnitude;
        exact += layer.bias_values[o];
        EXPECT_NEAR(out[m * kOut + o], exact,
                    sum_bound + std::ldexp(std::abs(exact) + sum_bound, -24))
            << CpuIsaName(isa) << " row " << m << " feature " << o;
      }
    }
  }
}

// The contract the row cache relies on: a row's bits are the same computed
// alone, inside 50 rows, at 1, 2 and 4 threads, and on every engine.  The
// shape leaves remainders in every tile (rows, features, k not a multiple
// of 32).  With bf16 weights, a batch holding one row that is not made of
// bf16 values runs the FMA engine where a row alone runs VDPBF16PS (on a
// CPU that has it): the bits must not change either.
TEST(LinearTest, RowsAreBatchThreadAndEngineInvariant) {
  constexpr int64_t kIn = 301, kOut = 139, kRows = 50;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    Layer layer = RandomLayer(dtype, kIn, kOut, 5);
    std::vector<float> x = RandomRows(kRows, kIn, 6);
    for (int64_t i = 0; i < (kRows - 1) * kIn; ++i) {
      x[i] = BFloat16ToFloat(FloatToBFloat16(x[i]));
    }
    std::vector<float> reference;
    for (CpuIsa isa : SupportedCpuIsas()) {
      for (int threads : {1, 2, 4}) {
        const std::vector<float> batch =
            ForwardOn(isa, layer, x, kRows, dtype, threads);
        for (int64_t m = 0; m < kRows; ++m) {
          const std::vector<float> row(x.begin() + m * kIn,
                                       x.begin() + (m + 1) * kIn);
          const std::vector<float> alone =
              ForwardOn(isa, layer, row, 1, dtype, threads);
          ASSERT_EQ(0, std::memcmp(alone.data(), batch.data() + m * kOut,
                                   kOut * sizeof(float)))
              << "row " << m << " of " << kRows << ", " << threads
              << " threads, " << CpuIsaName(isa) << ", " << DTypeName(dtype);
        }
        // The first 7 rows: any other row count.
        const std::vector<float> few(x.begin(), x.begin() + 7 * kIn);
        const std::vector<float> seven =
            ForwardOn(isa, layer, few, 7, dtype, threads);
        ASSERT_EQ(0, std::memcmp(seven.data(), batch.data(),
                                 seven.size() * sizeof(float)))
            << threads << " threads, " << CpuIsaName(isa) << ", "
            << DTypeName(dtype);
        if (reference.empty()) {
          reference = batch;
          continue;
        }
        ASSERT_EQ(0, std::memcmp(reference.data(), batch.data(),
                                 batch.size() * sizeof(float)))
            << CpuIsaName(isa) << " at " << threads << " threads against "
            << CpuIsaName(SupportedCpuIsas().front()) << ", "
            << DTypeName(dtype);
      }
    }
  }
}

TEST(LinearTest, EveryEngineGivesTheSameBits) {
  // Shapes that leave remainders in every tile: rows, features and k.
  constexpr int64_t kIn = 301, kOut = 71, kRows = 7;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    Layer layer = RandomLayer(dtype, kIn, kOut, 8);
    const std::vector<float> x = RandomRows(kRows, kIn, 9);
    std::vector<float> first;
    for (CpuIsa isa : SupportedCpuIsas()) {
      const std::vector<float> out = ForwardOn(isa, layer, x, kRows, dtype, 2);
      if (first.empty()) {
        first = out;
        continue;
      }
      EXPECT_EQ(
          0, std::memcmp(first.data(), out.data(), out.size() * sizeof(float)))
          << CpuIsaName(isa) << " " << DTypeName(dtype);
    }
  }
}

// bf16 weights near the bottom of the float32 range: products and sums that
// are denormal read as zero and flush to zero the same way on every engine
// (VDPBF16PS's rule, which the FMA engines and the baseline follow).
TEST(LinearTest, Bf16TinyValuesFlushTheSameOnEveryEngine) {
  constexpr int64_t kIn = 96, kOut = 64, kRows = 6;
  std::mt19937 rng(21);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-72, -58);
  Layer layer;
  for (int64_t i = 0; i < kIn * kOut; ++i) {
    const uint16_t bits =
        FloatToBFloat16(std::ldexp(mantissa(rng), exponent(rng)));
    layer.weight.push_back(static_cast<uint8_t>(bits & 0xff));
    layer.weight.push_back(static_cast<uint8_t>(bits >> 8));
  }
  layer.params.dtype = DType::kBFloat16;
  layer.params.in_features = kIn;
  layer.params.out_features = kOut;
  std::vector<float> x(kRows * kIn);
  for (float& v : x) {
    v = BFloat16ToFloat(
        FloatToBFloat16(std::ldexp(mantissa(rng), exponent(rng))));
  }
  // Some denormal inputs and weights, read as zero.
  x[3] = std::ldexp(1.0f, -130);
  layer.weight[10] = 1;
  layer.weight[11] = 0;
  std::vector<float> first;
  for (CpuIsa isa : SupportedCpuIsas()) {
    const std::vector<float> out =
        ForwardOn(isa, layer, x, kRows, DType::kFloat32, 2);
    if (first.empty()) {
      first = out;
      continue;
    }
    EXPECT_EQ(0,
              std::memcmp(first.data(), out.data(), out.size() * sizeof(float)))
        << CpuIsaName(isa);
  }
  // Without a flush, scaling the inputs by 2^64 would scale every result by
  // exactly 2^64; results that differ show that the flush was exercised.
  std::vector<float> scaled = x;
  for (float& v : scaled) v = std::ldexp(v, 64);
  scaled[3] = 0.0f;  // what the denormal input is read as
  const std::vector<float> big = ForwardOn(SupportedCpuIsas().front(), layer,
                                           scaled, kRows, DType::kFloat32, 2);
  int64_t flushed = 0;
  for (size_t i = 0; i < big.size(); ++i) {
    flushed += std::ldexp(first[i], 64) != big[i];
  }
  EXPECT_GT(flushed, 0);
}

TEST(LinearTest, RefusesMismatchedSpans) {
  Layer layer = RandomLayer(DType::kFloat32, 8, 4, 7);
  layer.params.weight = layer.weight;
  layer.params.bias = absl::MakeConstSpan(layer.bias).subspan(4);
  std::vector<float> x(8), out(4);
  absl::Status status = LinearForward(layer.params, x, 1, DType::kFloat32, 1,
                                      absl::MakeSpan(out));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("bias"), absl::string_view::npos);
  layer.params.bias = layer.bias;
  status = LinearForward(layer.params, x, 2, DType::kFloat32, 1,
                         absl::MakeSpan(out));
  EXPECT_NE(status.message().find("input"), absl::string_view::npos);
}

}  // namespace
}  // namespace temb
