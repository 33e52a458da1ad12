// The CPU engines' sin/cos against float64 sin/cos.
//
// The AVX2 and AVX-512 engines evaluate float32 angles below 2^20 rad in
// double (kernels/cpu/sincos_via_double.h), which promises at most
// 0.5 + 2^-12 ulp: correctly rounded except within ~2^-36 of a halfway
// point.  These tests check that bound over the whole range of that path:
//   - every float in [0, 2^20) and (-2^20, 0] with a stride
//   (TEMB_SINCOS_STRIDE,
//     default 61; 1 checks every float: 75 s per engine on one core),
//   - every float within 8 ulps of each multiple of pi/2 below 2^20, where
//     the reduction cancels most and an inexact step would show first,
// and that larger angles (SLEEF's full-range path) stay within 1 ulp.  The
// reference is glibc's double sin/cos, within an ulp of double: its own
// error is ~2^-29 ulp of float32.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "temb/kernels/cpu_backend.h"

namespace temb {
namespace {

constexpr double kDoublePathLimit = 1048576.0;  // 2^20
// 0.5 + 2^-12: the bound sincos_via_double.h derives.
constexpr double kDoublePathMaxUlp = 0.5 + 1.0 / 4096;

// One ulp of float32 at the magnitude of `x` (a double near a float result).
double Ulp32(double x) {
  const double magnitude = std::fabs(x);
  if (magnitude < std::ldexp(1.0, -126)) return std::ldexp(1.0, -149);
  int exponent;
  std::frexp(magnitude, &exponent);  // magnitude in [2^(e-1), 2^e)
  return std::ldexp(1.0, exponent - 24);
}

float FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

struct ErrorSummary {
  double max_ulp = 0;
  float worst_angle = 0;
  int64_t angles = 0;
  int64_t not_correctly_rounded = 0;
};

// Runs `angles` through the engine and folds their errors into `summary`.
void Measure(CpuIsa isa, const std::vector<float>& angles,
             ErrorSummary* summary) {
  std::vector<float> s(angles.size()), c(angles.size());
  ASSERT_TRUE(CpuEngineSinCos(isa, angles.data(),
                              static_cast<int64_t>(angles.size()), s.data(),
                              c.data())
                  .ok());
  for (size_t i = 0; i < angles.size(); ++i) {
    const double a = angles[i];
    const double want[2] = {std::sin(a), std::cos(a)};
    const float got[2] = {s[i], c[i]};
    for (int k = 0; k < 2; ++k) {
      const double ulp = std::fabs(got[k] - want[k]) / Ulp32(want[k]);
      if (ulp > summary->max_ulp) {
        summary->max_ulp = ulp;
        summary->worst_angle = angles[i];
      }
      summary->not_correctly_rounded += got[k] != static_cast<float>(want[k]);
    }
    ++summary->angles;
  }
}

int64_t Stride() {
  const char* value = std::getenv("TEMB_SINCOS_STRIDE");
  const int64_t stride = value ? std::atoll(value) : 0;
#if defined(__SANITIZE_ADDRESS__) || defined(TEMB_TEST_UNDER_CLANG_ASAN)
  return stride > 0 ? stride : 1009;  // AddressSanitizer slows this ~8x
#else
  return stride > 0 ? stride : 61;
#endif
}

std::vector<CpuIsa> DoublePathEngines() {
  std::vector<CpuIsa> isas;
  for (CpuIsa isa : SupportedCpuIsas()) {
    if (isa == CpuIsa::kAvx2 || isa == CpuIsa::kAvx512) isas.push_back(isa);
  }
  return isas;
}

class DoublePathTest : public ::testing::TestWithParam<CpuIsa> {};

TEST_P(DoublePathTest, EveryStridedFloatBelowTheLimitIsWithinTheBound) {
  const uint32_t limit_bits = 0x49800000;  // 2^20
  const int64_t stride = Stride();
  ErrorSummary summary;
  std::vector<float> angles;
  angles.reserve(1 << 20);
  // Positive angles from bit pattern 0, negative ones offset by half a
  // stride so the two signs see different magnitudes.
  for (const uint32_t sign : {0u, 0x80000000u}) {
    for (int64_t bits = sign ? stride / 2 : 0; bits < limit_bits;
         bits += stride) {
      angles.push_back(FromBits(static_cast<uint32_t>(bits) | sign));
      if (angles.size() == angles.capacity()) {
        Measure(GetParam(), angles, &summary);
        angles.clear();
      }
    }
  }
  Measure(GetParam(), angles, &summary);
  RecordProperty("angles", std::to_string(summary.angles));
  RecordProperty("max_ulp", std::to_string(summary.max_ulp));
  RecordProperty("not_correctly_rounded",
                 std::to_string(summary.not_correctly_rounded));
  EXPECT_LE(summary.max_ulp, kDoublePathMaxUlp)
      << "at angle " << summary.worst_angle << " (" << summary.angles
      << " angles, stride " << stride << ")";
  // Near-halfway cases are rare: 3 in 10^6 results over every float.
  EXPECT_LT(summary.not_correctly_rounded, summary.angles / 10000 + 1)
      << summary.not_correctly_rounded << " of " << 2 * summary.angles;
}

TEST_P(DoublePathTest, AnglesNearMultiplesOfHalfPiAreWithinTheBound) {
  ErrorSummary summary;
  std::vector<float> angles;
  const double half_pi = 1.5707963267948966;
  const int64_t multiples =
      static_cast<int64_t>(kDoublePathLimit / half_pi);  // 667544
#if defined(__SANITIZE_ADDRESS__) || defined(TEMB_TEST_UNDER_CLANG_ASAN)
  const int64_t step = 97;
#else
  const int64_t step = 1;
#endif
  for (int64_t k = 1; k <= multiples; k += step) {
    const float nearest = static_cast<float>(k * half_pi);
    uint32_t bits;
    std::memcpy(&bits, &nearest, 4);
    for (int d = -8; d <= 8; ++d) {
      const float a = FromBits(bits + d);
      if (a < kDoublePathLimit) angles.push_back(k % 2 ? a : -a);
    }
    if (angles.size() >= (1 << 20)) {
      Measure(GetParam(), angles, &summary);
      angles.clear();
    }
  }
  Measure(GetParam(), angles, &summary);
  RecordProperty("max_ulp", std::to_string(summary.max_ulp));
  EXPECT_LE(summary.max_ulp, kDoublePathMaxUlp)
      << "at angle " << summary.worst_angle;
}

TEST_P(DoublePathTest, SignedZerosAndTinyAnglesAreExact) {
  const std::vector<float> angles = {0.0f,    -0.0f,  1e-30f,
                                     -1e-30f, 1e-40f, -1e-45f};
  std::vector<float> s(angles.size()), c(angles.size());
  ASSERT_TRUE(CpuEngineSinCos(GetParam(), angles.data(),
                              static_cast<int64_t>(angles.size()), s.data(),
                              c.data())
                  .ok());
  for (size_t i = 0; i < angles.size(); ++i) {
    // sin a = a and cos a = 1 to far below float32 resolution.
    EXPECT_EQ(std::memcmp(&s[i], &angles[i], 4), 0) << angles[i];
    EXPECT_EQ(c[i], 1.0f) << angles[i];
  }
}

// A vector with one lane at or above the limit goes to SLEEF's full-range
// path for every lane: all of them stay within 1 ulp.
TEST_P(DoublePathTest, LargeAnglesAndMixedVectorsStayWithinOneUlp) {
  std::mt19937_64 rng(20261124);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<float> angles;
  for (int i = 0; i < (1 << 16); ++i) {
    const double u = unit(rng);
    // Every fourth angle beyond the limit (up to 2^26), the rest below it,
    // so most vectors mix the two.
    const double a = i % 4 == 0 ? kDoublePathLimit * std::pow(64.0, u)
                                : kDoublePathLimit * u;
    angles.push_back(static_cast<float>(i % 2 ? -a : a));
  }
  ErrorSummary summary;
  Measure(GetParam(), angles, &summary);
  EXPECT_LE(summary.max_ulp, 1.0) << "at angle " << summary.worst_angle;
}

// Both double-path engines compute the same operations in the same order:
// their results are identical bit for bit.
TEST(DoublePathEnginesTest, Avx2AndAvx512AgreeBitwise) {
  const std::vector<CpuIsa> isas = DoublePathEngines();
  if (isas.size() < 2) GTEST_SKIP() << "this CPU has no AVX-512";
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  std::vector<float> angles(1 << 18);
  for (size_t i = 0; i < angles.size(); ++i) {
    angles[i] = static_cast<float>(kDoublePathLimit * unit(rng) *
                                   std::pow(2.0, -20.0 * std::fabs(unit(rng))));
  }
  std::vector<float> s[2], c[2];
  for (int e = 0; e < 2; ++e) {
    s[e].resize(angles.size());
    c[e].resize(angles.size());
    ASSERT_TRUE(CpuEngineSinCos(isas[e], angles.data(),
                                static_cast<int64_t>(angles.size()),
                                s[e].data(), c[e].data())
                    .ok());
  }
  EXPECT_EQ(std::memcmp(s[0].data(), s[1].data(), angles.size() * 4), 0);
  EXPECT_EQ(std::memcmp(c[0].data(), c[1].data(), angles.size() * 4), 0);
}

TEST(CpuEngineSinCosTest, UnsupportedEngineIsRefused) {
  const std::vector<CpuIsa> supported = SupportedCpuIsas();
  float a = 1.0f, s, c;
  for (CpuIsa isa : {CpuIsa::kSse2, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    bool runs = false;
    for (CpuIsa have : supported) runs |= have == isa;
    const absl::Status status = CpuEngineSinCos(isa, &a, 1, &s, &c);
    EXPECT_EQ(status.ok(), runs) << CpuIsaName(isa) << ": " << status;
    if (!runs) {
      EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
    }
  }
}

std::string IsaName(const ::testing::TestParamInfo<CpuIsa>& info) {
  return std::string(CpuIsaName(info.param));
}

INSTANTIATE_TEST_SUITE_P(Engines, DoublePathTest,
                         ::testing::ValuesIn(DoublePathEngines()), IsaName);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(DoublePathTest);

}  // namespace
}  // namespace temb
