// The CPU backend against the committed float64 golden tables
// (tests/reference/generate_golden.py), for every engine this CPU can run,
// every dtype and both precisions.
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernel_test_util.h"
#include "nlohmann/json.hpp"

namespace temb {
namespace {

using ::temb::testing::Element;
using ::temb::testing::Float32PathBound;
using ::temb::testing::Float64PathBound;
using ::temb::testing::kAllDTypes;
using ::temb::testing::kAllIsas;

struct GoldenCase {
  std::string name;
  EmbeddingSpec spec;
  std::vector<float> timesteps;
  std::vector<std::vector<double>> expected;
};

std::vector<GoldenCase> LoadGolden() {
  // The environment may move the tree (a bundle run on another machine).
  const char* moved = std::getenv("TEMB_TEST_DATA_DIR");
  const std::string path =
      std::string(moved != nullptr ? moved : TEMB_TEST_DATA_DIR) +
      "/reference/golden/embeddings.json";
  std::ifstream file(path);
  EXPECT_TRUE(file.good()) << "cannot open " << path;
  if (!file.good()) return {};
  const nlohmann::json doc = nlohmann::json::parse(file);
  std::vector<GoldenCase> cases;
  for (const auto& c : doc.at("cases")) {
    GoldenCase g;
    g.name = c.at("name").get<std::string>();
    const auto& s = c.at("spec");
    g.spec.dim = s.at("dim").get<int>();
    g.spec.max_period = s.at("max_period").get<double>();
    g.spec.flip_sin_to_cos = s.at("flip_sin_to_cos").get<bool>();
    g.spec.downscale_freq_shift = s.at("downscale_freq_shift").get<double>();
    g.spec.scale = s.at("scale").get<double>();
    g.spec.time_factor = s.at("time_factor").get<double>();
    g.spec.repeat_only = s.at("repeat_only").get<bool>();
    g.spec.layout = s.at("layout").get<std::string>() == "interleaved"
                        ? Layout::kInterleaved
                        : Layout::kHalves;
    // Written only where it is not the default (divide_last).
    g.spec.exponent_order =
        s.value("exponent_order", "divide_last") == "slope_first"
            ? ExponentOrder::kSlopeFirst
            : ExponentOrder::kDivideLast;
    for (double t : c.at("timesteps"))
      g.timesteps.push_back(static_cast<float>(t));
    g.expected = c.at("expected").get<std::vector<std::vector<double>>>();
    cases.push_back(std::move(g));
  }
  return cases;
}

const std::vector<GoldenCase>& Golden() {
  static const auto* cases = new std::vector<GoldenCase>(LoadGolden());
  return *cases;
}

TEST(GoldenTablesTest, CoverEveryFamilyAndEdgeCase) {
  const auto& cases = Golden();
  ASSERT_GE(cases.size(), 30u);
  bool odd = false, dim1 = false, interleaved = false, repeat = false,
       time_factor = false, shift1 = false, zero_t = false, negative_t = false,
       slope_first = false;
  for (const GoldenCase& c : cases) {
    ASSERT_EQ(c.expected.size(), c.timesteps.size()) << c.name;
    for (const auto& row : c.expected)
      ASSERT_EQ(row.size(), size_t(c.spec.dim)) << c.name;
    odd |= c.spec.dim % 2 == 1 && c.spec.dim > 1;
    dim1 |= c.spec.dim == 1 && !c.spec.repeat_only;
    interleaved |= c.spec.layout == Layout::kInterleaved;
    repeat |= c.spec.repeat_only;
    time_factor |= c.spec.time_factor != 1.0;
    shift1 |= c.spec.downscale_freq_shift == 1.0;
    slope_first |= c.spec.exponent_order == ExponentOrder::kSlopeFirst;
    for (float t : c.timesteps) {
      zero_t |= t == 0.0f;
      negative_t |= t < 0.0f;
    }
  }
  EXPECT_TRUE(odd && dim1 && interleaved && repeat && time_factor && shift1 &&
              zero_t && negative_t && slope_first);
}

class GoldenTest : public ::testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override {
    if (!testing::IsaSupported(GetParam())) {
      GTEST_SKIP() << "this CPU cannot run the " << CpuIsaName(GetParam())
                   << " engine";
    }
    auto backend = CreateCpuBackendForIsa(GetParam(), 1);
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = std::move(*backend);
  }

  void CheckAll(Precision precision) {
    for (const GoldenCase& c : Golden()) {
      for (DType dtype : kAllDTypes) {
        EmbeddingSpec spec = c.spec;
        spec.dtype = dtype;
        spec.precision = precision;
        auto out = testing::RunRequest(*backend_, spec, c.timesteps);
        ASSERT_TRUE(out.ok()) << c.name << ": " << out.status();
        for (size_t n = 0; n < c.timesteps.size(); ++n) {
          const float t = c.timesteps[n];
          for (int j = 0; j < spec.dim; ++j) {
            const double want = c.expected[n][j];
            const double got = Element(*out, dtype, n * spec.dim + j);
            const double bound = precision == Precision::kFloat32
                                     ? Float32PathBound(spec, t, want)
                                     : Float64PathBound(spec, t, want);
            ASSERT_LE(std::fabs(got - want), bound)
                << c.name << " dtype=" << DTypeName(dtype) << " t=" << t
                << " column " << j << " got " << got << " want " << want;
          }
        }
      }
    }
  }

  std::unique_ptr<Backend> backend_;
};

TEST_P(GoldenTest, Float32Precision) { CheckAll(Precision::kFloat32); }

TEST_P(GoldenTest, Float64Precision) { CheckAll(Precision::kFloat64); }

INSTANTIATE_TEST_SUITE_P(Engines, GoldenTest, ::testing::ValuesIn(kAllIsas),
                         testing::IsaTestName);

}  // namespace
}  // namespace temb
