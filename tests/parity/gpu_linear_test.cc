// The conditioning models' Linear on the GPU (cuBLASLt) against the CPU
// kernel and float64: every output within a float32 summation's worst case
// and one unit of its dtype of the float64 result, and
// each row's bits the same alone, inside 50 rows and at either end of a
// row tile.  Without a usable device every test skips and says why (or
// fails, when TEMB_REQUIRE_CUDA is set).
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "temb/kernels/dtype.h"
#include "temb/kernels/linear.h"
#include "temb/kernels/linear_engine.h"
#include "temb/kernels/registry.h"

namespace temb {
namespace {

struct Layer {
  DType dtype;
  int64_t in;
  int64_t out;
  std::vector<uint8_t> weight;
  std::vector<uint8_t> bias;
  std::vector<double> weight_values;
  std::vector<double> bias_values;
};

Layer RandomLayer(DType dtype, int64_t in, int64_t out, uint32_t seed) {
  std::mt19937 random(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt(in));
  Layer layer{dtype, in, out, {}, {}, {}, {}};
  auto append = [&](float value, std::vector<uint8_t>* bytes,
                    std::vector<double>* values) {
    const float rounded = RoundToDType(value, dtype);
    values->push_back(rounded);
    if (dtype == DType::kFloat32) {
      const auto* p = reinterpret_cast<const uint8_t*>(&rounded);
      bytes->insert(bytes->end(), p, p + 4);
    } else {
      const uint16_t bits = dtype == DType::kBFloat16 ? FloatToBFloat16(rounded)
                                                      : FloatToHalf(rounded);
      bytes->push_back(static_cast<uint8_t>(bits & 0xff));
      bytes->push_back(static_cast<uint8_t>(bits >> 8));
    }
  };
  for (int64_t i = 0; i < in * out; ++i) {
    append(normal(random), &layer.weight, &layer.weight_values);
  }
  for (int64_t o = 0; o < out; ++o) {
    append(normal(random), &layer.bias, &layer.bias_values);
  }
  return layer;
}

std::vector<float> RandomRows(int64_t rows, int64_t in, DType dtype,
                              uint32_t seed) {
  std::mt19937 random(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(rows * in);
  for (float& v : x) v = RoundToDType(normal(random), dtype);
  return x;
}

// One unit in the last place of `value` in `dtype`.
double Ulp(double value, DType dtype) {
  const int mantissa = dtype == DType::kFloat32    ? 23
                       : dtype == DType::kBFloat16 ? 7
                                                   : 10;
  const double magnitude = std::max(std::fabs(value), 1e-30);
  return std::ldexp(1.0, std::ilogb(magnitude) - mantissa);
}

class GpuLinearTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<LinearEngine>> engine =
        CreateGpuLinearEngine(0);
    if (!engine.ok()) {
      if (std::getenv("TEMB_REQUIRE_CUDA") != nullptr) {
        FAIL() << "TEMB_REQUIRE_CUDA is set but the GPU Linear engine "
                  "cannot start: "
               << engine.status();
      }
      GTEST_SKIP() << "no GPU Linear engine: " << engine.status();
    }
    engine_ = *std::move(engine);
  }

  std::unique_ptr<LinearEngine> engine_;
};

TEST_P(GpuLinearTest, AgreesWithFloat64AndIsBatchInvariant) {
  const DType dtype = GetParam();
  // A modulation-shaped Linear (K = 256, N = 6 x 96) and 150 rows: several
  // row tiles (CublasLinearEngine::kRowTile), the last one partial.
  const Layer layer = RandomLayer(dtype, 256, 576, 7);
  LinearWeights weights;
  weights.weight = layer.weight;
  weights.bias = layer.bias;
  weights.dtype = dtype;
  weights.in_features = layer.in;
  weights.out_features = layer.out;
  absl::StatusOr<int> id = engine_->Upload(weights);
  ASSERT_TRUE(id.ok()) << id.status();
  const int64_t rows = 150;
  const std::vector<float> x = RandomRows(rows, layer.in, dtype, 11);
  std::vector<float> out(rows * layer.out);
  ASSERT_TRUE(engine_->Forward(*id, x, rows, dtype, absl::MakeSpan(out)).ok());

  // Against float64: within the worst case of a float32 sum of the K
  // products in any order, K 2^-24 sum |x_k w_k| (the engine's order is
  // cuBLAS's), plus one unit of the output dtype for the final rounding.
  // Where the sum does not cancel this is one unit; where it does, the
  // float32 error can exceed a unit of the small result in any order.
  int64_t beyond = 0;
  for (int64_t m = 0; m < rows; ++m) {
    for (int64_t o = 0; o < layer.out; ++o) {
      double exact = layer.bias_values[o];
      double magnitudes = std::fabs(layer.bias_values[o]);
      for (int64_t k = 0; k < layer.in; ++k) {
        const double term = static_cast<double>(x[m * layer.in + k]) *
                            layer.weight_values[o * layer.in + k];
        exact += term;
        magnitudes += std::fabs(term);
      }
      const double error = std::fabs(out[m * layer.out + o] - exact);
      const double allowed = Ulp(exact, dtype) +
                             (layer.in + 1) * std::ldexp(1.0, -24) * magnitudes;
      if (error > allowed) ++beyond;
    }
  }
  EXPECT_EQ(beyond, 0);

  // Batch invariance: rows alone give the same bits as in 150 rows, among
  // them a tile's last row and the next one's first (for tiles of 16 or 64
  // rows) and the partial tile's last.
  for (const int64_t m : {0, 15, 16, 63, 64, 149}) {
    std::vector<float> alone(layer.out);
    ASSERT_TRUE(
        engine_
            ->Forward(*id,
                      absl::MakeConstSpan(x).subspan(m * layer.in, layer.in), 1,
                      dtype, absl::MakeSpan(alone))
            .ok());
    EXPECT_EQ(
        std::memcmp(alone.data(), out.data() + m * layer.out, alone.size() * 4),
        0)
        << "row " << m;
  }
  // Against the CPU kernel: the same values up to the summation order.  A
  // 16-bit output hides most order differences in its last rounding, so
  // most elements are bit-equal; float32 outputs show every one of them.
  std::vector<float> cpu(rows * layer.out);
  LinearWeights params;
  params.weight = layer.weight;
  params.bias = layer.bias;
  params.dtype = dtype;
  params.in_features = layer.in;
  params.out_features = layer.out;
  ASSERT_TRUE(
      LinearForward(params, x, rows, dtype, 2, absl::MakeSpan(cpu)).ok());
  int64_t equal = 0;
  for (size_t i = 0; i < cpu.size(); ++i) equal += cpu[i] == out[i];
  RecordProperty("bitwise_equal_to_cpu", static_cast<int>(equal));
  std::cout << DTypeName(dtype) << ": " << equal << " of " << cpu.size()
            << " elements bit-equal to the CPU kernel's, " << beyond
            << " beyond the bound against float64, on " << engine_->name()
            << "\n";
  if (dtype != DType::kFloat32) {
    EXPECT_GT(equal, static_cast<int64_t>(cpu.size()) / 2);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuLinearTest,
                         ::testing::Values(DType::kBFloat16, DType::kFloat32,
                                           DType::kFloat16));

TEST(GpuLinearEngineTest, RefusesBadShapesNamingTheField) {
  absl::StatusOr<std::unique_ptr<LinearEngine>> engine =
      CreateGpuLinearEngine(0);
  if (!engine.ok()) GTEST_SKIP() << "no GPU Linear engine: " << engine.status();
  std::vector<uint8_t> weight(10);
  LinearWeights weights;
  weights.weight = weight;
  weights.dtype = DType::kFloat32;
  weights.in_features = 2;
  weights.out_features = 2;
  const absl::Status status = (*engine)->Upload(weights).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("weight"), absl::string_view::npos);
}

}  // namespace
}  // namespace temb
