// Exact conversions to fp16 and bf16: round trips over every bit pattern,
// round-to-nearest-even against an independent nearest-value search, ties,
// subnormals, overflow, and single rounding from double.
#include "temb/kernels/dtype.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace temb {
namespace {

float Bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

bool HalfIsNan(uint16_t h) {
  return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
}
bool BFloat16IsNan(uint16_t b) {
  return (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0;
}

// Every finite non-negative value of a 16-bit format, ascending, with its
// bits: the reference rounds by searching this table, not by bit tricks.
struct Grid {
  std::vector<double> values;
  std::vector<uint16_t> bits;
};

Grid FiniteGrid(float (*decode)(uint16_t), uint16_t max_finite) {
  Grid grid;
  for (uint32_t b = 0; b <= max_finite; ++b) {
    grid.values.push_back(decode(static_cast<uint16_t>(b)));
    grid.bits.push_back(static_cast<uint16_t>(b));
  }
  return grid;
}

// Nearest grid value to x, ties to the even bit pattern (= even mantissa);
// beyond max + half an ulp: infinity.
uint16_t ReferenceRound(const Grid& grid, double x, uint16_t infinity) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  const double max = grid.values.back();
  const double half_ulp = (max - grid.values[grid.values.size() - 2]) / 2;
  if (a >= max + half_ulp) return sign | infinity;
  const auto it = std::lower_bound(grid.values.begin(), grid.values.end(), a);
  if (it == grid.values.end()) return sign | grid.bits.back();
  size_t hi = it - grid.values.begin();
  if (grid.values[hi] == a || hi == 0) return sign | grid.bits[hi];
  const size_t lo = hi - 1;
  const double dlo = a - grid.values[lo];
  const double dhi = grid.values[hi] - a;
  size_t pick = dlo < dhi ? lo : hi;
  if (dlo == dhi) pick = (grid.bits[lo] & 1) == 0 ? lo : hi;
  return sign | grid.bits[pick];
}

TEST(DTypeTest, SizesAndNames) {
  EXPECT_EQ(DTypeSize(DType::kFloat32), 4u);
  EXPECT_EQ(DTypeSize(DType::kFloat16), 2u);
  EXPECT_EQ(DTypeSize(DType::kBFloat16), 2u);
  EXPECT_EQ(DTypeSize(DType::kFloat64), 8u);
  for (DType d :
       {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64}) {
    auto parsed = ParseDType(DTypeName(d));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, d);
  }
  EXPECT_EQ(*ParseDType("bfloat16"), DType::kBFloat16);
  auto bad = ParseDType("int8");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(),
            "dtype must be one of fp32, fp16, bf16, fp64, got \"int8\"");
}

TEST(DTypeTest, HalfRoundTripsEveryPattern) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint16_t h = static_cast<uint16_t>(b);
    const float f = HalfToFloat(h);
    if (HalfIsNan(h)) {
      EXPECT_TRUE(std::isnan(f)) << b;
      EXPECT_TRUE(HalfIsNan(FloatToHalf(f))) << b;
      continue;
    }
    ASSERT_EQ(FloatToHalf(f), h) << "pattern " << b;
    ASSERT_EQ(DoubleToHalf(f), h) << "pattern " << b;
  }
}

TEST(DTypeTest, BFloat16RoundTripsEveryPattern) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint16_t h = static_cast<uint16_t>(b);
    const float f = BFloat16ToFloat(h);
    uint32_t widened;
    std::memcpy(&widened, &f, 4);
    ASSERT_EQ(widened, b << 16) << b;  // bf16 is the top half of a float
    if (BFloat16IsNan(h)) {
      EXPECT_TRUE(BFloat16IsNan(FloatToBFloat16(f))) << b;
      continue;
    }
    ASSERT_EQ(FloatToBFloat16(f), h) << "pattern " << b;
    ASSERT_EQ(DoubleToBFloat16(f), h) << "pattern " << b;
  }
}

TEST(DTypeTest, HalfValuesOfKnownPatterns) {
  EXPECT_EQ(HalfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(HalfToFloat(0xc000), -2.0f);
  EXPECT_EQ(HalfToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(HalfToFloat(0x0400), std::ldexp(1.0f, -14));
  EXPECT_EQ(HalfToFloat(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_TRUE(std::isinf(HalfToFloat(0x7c00)));
  EXPECT_TRUE(std::signbit(HalfToFloat(0x8000)));
}

TEST(DTypeTest, HalfTiesRoundToEven) {
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // 1 | 1+u
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)),
            0x3c02);  // 1+u | 1+2u
  EXPECT_EQ(FloatToHalf(-(1.0f + std::ldexp(1.0f, -11))), 0xbc00);
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -23)),
            0x3c01);
  EXPECT_EQ(FloatToHalf(2049.0f), 0x6800);  // 2048 | 2050: to even 2048
  EXPECT_EQ(FloatToHalf(2051.0f), 0x6802);  // 2050 | 2052: to even 2052
}

TEST(DTypeTest, HalfSubnormalsAndOverflow) {
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);  // tie to even 0
  EXPECT_EQ(FloatToHalf(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 -> 2
  EXPECT_EQ(FloatToHalf(std::ldexp(5.0f, -25)), 0x0002);  // 2.5 -> 2
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -26)), 0x0000);
  EXPECT_EQ(FloatToHalf(-std::ldexp(1.0f, -24)), 0x8001);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -25)),
            0x0400);  // up to normal
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65519.99f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);  // the tie above max goes to inf
  EXPECT_EQ(FloatToHalf(-1e6f), 0xfc00);
  EXPECT_EQ(FloatToHalf(Bits(0x7f800000)), 0x7c00);
}

TEST(DTypeTest, BFloat16TiesAndEdges) {
  EXPECT_EQ(FloatToBFloat16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(FloatToBFloat16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(FloatToBFloat16(-(1.0f + std::ldexp(1.0f, -8))), 0xbf80);
  EXPECT_EQ(FloatToBFloat16(Bits(0x00010000)), 0x0001);  // subnormal, exact
  EXPECT_EQ(FloatToBFloat16(Bits(0x00008000)), 0x0000);  // tie to even 0
  EXPECT_EQ(FloatToBFloat16(Bits(0x00018000)), 0x0002);  // tie to even 2
  EXPECT_EQ(FloatToBFloat16(Bits(0x7f7fffff)), 0x7f80);  // float max -> inf
  EXPECT_EQ(FloatToBFloat16(Bits(0x7f7f7fff)), 0x7f7f);
}

// Random float bit patterns in and around the finite half range, against
// the nearest-value search.
TEST(DTypeTest, FloatToHalfMatchesNearestValueSearch) {
  const Grid grid = FiniteGrid(HalfToFloat, 0x7bff);
  std::mt19937 rng(20240601);
  // Exponents from below the subnormals to past the largest half.
  std::uniform_int_distribution<uint32_t> exponent(127 - 27, 127 + 17);
  std::uniform_int_distribution<uint32_t> mantissa(0, (1u << 23) - 1);
  for (int k = 0; k < 1000000; ++k) {
    const uint32_t sign = (k & 1) ? 0x80000000u : 0;
    const float f = Bits(sign | (exponent(rng) << 23) | mantissa(rng));
    ASSERT_EQ(FloatToHalf(f), ReferenceRound(grid, f, 0x7c00)) << f;
  }
  // Every exact midpoint between neighbouring halves is a tie.
  for (size_t i = 0; i + 1 < grid.values.size(); ++i) {
    const float mid =
        static_cast<float>((grid.values[i] + grid.values[i + 1]) / 2);
    ASSERT_EQ(FloatToHalf(mid), ReferenceRound(grid, mid, 0x7c00)) << mid;
  }
}

TEST(DTypeTest, FloatToBFloat16MatchesNearestValueSearch) {
  const Grid grid = FiniteGrid(BFloat16ToFloat, 0x7f7f);
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits(0, 0x7f7fffffu);
  for (int k = 0; k < 1000000; ++k) {
    const uint32_t sign = (k & 1) ? 0x80000000u : 0;
    const float f = Bits(sign | bits(rng));
    ASSERT_EQ(FloatToBFloat16(f), ReferenceRound(grid, f, 0x7f80)) << f;
  }
}

// Converting a double through float first would round twice; these values
// sit just above a tie of the narrow format but round to the tie in float.
TEST(DTypeTest, DoubleConversionsRoundOnce) {
  const double tiny = std::ldexp(1.0, -40);
  EXPECT_EQ(FloatToHalf(static_cast<float>(1.0 + std::ldexp(1.0, -11) + tiny)),
            0x3c00);
  EXPECT_EQ(DoubleToHalf(1.0 + std::ldexp(1.0, -11) + tiny), 0x3c01);
  EXPECT_EQ(DoubleToHalf(1.0 + std::ldexp(1.0, -11) - tiny), 0x3c00);
  EXPECT_EQ(DoubleToHalf(-(1.0 + std::ldexp(1.0, -11) + tiny)), 0xbc01);
  EXPECT_EQ(DoubleToHalf(std::ldexp(1.0, -25) + std::ldexp(1.0, -60)), 0x0001);
  EXPECT_EQ(DoubleToHalf(std::nextafter(65520.0, 0.0)), 0x7bff);
  EXPECT_EQ(DoubleToHalf(65520.0), 0x7c00);
  EXPECT_EQ(
      FloatToBFloat16(static_cast<float>(1.0 + std::ldexp(1.0, -8) + tiny)),
      0x3f80);
  EXPECT_EQ(DoubleToBFloat16(1.0 + std::ldexp(1.0, -8) + tiny), 0x3f81);
  EXPECT_EQ(DoubleToBFloat16(1.0 + std::ldexp(1.0, -8) - tiny), 0x3f80);

  const Grid half = FiniteGrid(HalfToFloat, 0x7bff);
  const Grid bf16 = FiniteGrid(BFloat16ToFloat, 0x7f7f);
  std::mt19937_64 rng(99);
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  std::uniform_int_distribution<int> scale(-30, 18);
  for (int k = 0; k < 200000; ++k) {
    const double x = std::ldexp(unit(rng), scale(rng));
    ASSERT_EQ(DoubleToHalf(x), ReferenceRound(half, x, 0x7c00))
        << std::hexfloat << x;
    ASSERT_EQ(DoubleToBFloat16(x), ReferenceRound(bf16, x, 0x7f80)) << x;
  }
}

}  // namespace
}  // namespace temb
