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
  LinearParams params;
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

TEST(LinearTest, RowsAreBatchAndThreadInvariant) {
  constexpr int64_t kIn = 257, kOut = 96, kRows = 37;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    Layer layer = RandomLayer(dtype, kIn, kOut, 5);
    const std::vector<float> x = RandomRows(kRows, kIn, 6);
    const std::vector<float> batch = Forward(layer, x, kRows, dtype, 3);
    for (int64_t m = 0; m < kRows; ++m) {
      const std::vector<float> row(x.begin() + m * kIn,
                                   x.begin() + (m + 1) * kIn);
      const std::vector<float> alone = Forward(layer, row, 1, dtype, 1);
      ASSERT_EQ(0, std::memcmp(alone.data(), batch.data() + m * kOut,
                               kOut * sizeof(float)))
          << "row " << m << " dtype " << DTypeName(dtype);
    }
  }
}

TEST(LinearTest, EveryEngineGivesTheSameBits) {
  // Shapes that leave remainders in every tile: rows, features and k.
  constexpr int64_t kIn = 301, kOut = 71, kRows = 7;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    Layer layer = RandomLayer(dtype, kIn, kOut, 8);
    layer.params.weight = layer.weight;
    layer.params.bias = layer.bias;
    const std::vector<float> x = RandomRows(kRows, kIn, 9);
    std::vector<float> first;
    for (CpuIsa isa : SupportedCpuIsas()) {
      std::vector<float> out(kRows * kOut);
      ASSERT_TRUE(LinearForwardOnIsa(isa, layer.params, x, kRows, dtype, 2,
                                     absl::MakeSpan(out))
                      .ok());
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
