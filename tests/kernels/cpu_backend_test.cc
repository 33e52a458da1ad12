// The CPU backend: properties every engine must have, randomized accuracy
// against an independent long-double evaluation, parity of every SIMD engine
// with the scalar one, and thread-count independence.
#include "temb/kernels/cpu_backend.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernel_test_util.h"
#include "temb/kernels/frequencies.h"

namespace temb {
namespace {

using ::temb::testing::Element;
using ::temb::testing::kAllDTypes;
using ::temb::testing::kAllIsas;
using ::temb::testing::ReferenceRow;
using ::temb::testing::RunRequest;

EmbeddingSpec Spec(int dim, DType dtype = DType::kFloat32,
                   Precision precision = Precision::kFloat32) {
  EmbeddingSpec spec;
  spec.dim = dim;
  spec.dtype = dtype;
  spec.precision = precision;
  return spec;
}

std::vector<uint8_t> MustRun(Backend& backend, const EmbeddingSpec& spec,
                             const std::vector<float>& t) {
  auto out = RunRequest(backend, spec, t);
  EXPECT_TRUE(out.ok()) << SpecDebugString(spec) << ": " << out.status();
  return out.ok() ? *out : std::vector<uint8_t>();
}

// The bytes of element (n, j).
std::vector<uint8_t> ElementBytes(const std::vector<uint8_t>& out,
                                  const EmbeddingSpec& spec, int64_t n, int j) {
  const size_t size = DTypeSize(spec.dtype);
  const uint8_t* p = out.data() + (n * spec.dim + j) * size;
  return std::vector<uint8_t>(p, p + size);
}

const std::vector<float> kSomeTimesteps = {0.0f,   1.0f,   999.0f,   500.5f,
                                           -3.25f, 0.001f, 12345.5f, -999.0f,
                                           0.5f,   77.0f,  250.25f,  -1e4f};

class CpuEngineTest : public ::testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override {
    if (!testing::IsaSupported(GetParam())) {
      GTEST_SKIP() << "this CPU cannot run the " << CpuIsaName(GetParam())
                   << " engine";
    }
    backend_ = Engine(GetParam(), 1);
  }

  static std::unique_ptr<Backend> Engine(CpuIsa isa, int threads) {
    auto backend = CreateCpuBackendForIsa(isa, threads);
    EXPECT_TRUE(backend.ok()) << backend.status();
    return backend.ok() ? std::move(*backend) : nullptr;
  }

  std::unique_ptr<Backend> backend_;
};

TEST_P(CpuEngineTest, DeviceNamesTheEngine) {
  EXPECT_EQ(backend_->kind(), BackendKind::kCpu);
  EXPECT_EQ(backend_->device(),
            "x86-64 " + std::string(CpuIsaName(GetParam())) + ", 1 thread");
  EXPECT_EQ(Engine(GetParam(), 3)->device(),
            "x86-64 " + std::string(CpuIsaName(GetParam())) + ", 3 threads");
}

TEST_P(CpuEngineTest, ZeroTimestepIsOnesThenZeros) {
  for (Precision precision : {Precision::kFloat32, Precision::kFloat64}) {
    for (DType dtype : kAllDTypes) {
      for (int dim : {2, 8, 33, 320}) {
        const EmbeddingSpec spec = Spec(dim, dtype, precision);
        const auto out = MustRun(*backend_, spec, {0.0f});
        for (int j = 0; j < dim; ++j) {
          const double want = j < dim / 2 ? 1.0 : 0.0;
          ASSERT_EQ(Element(out, dtype, j), want)
              << SpecDebugString(spec) << " col " << j;
          if (want == 0.0) {
            ASSERT_FALSE(std::signbit(Element(out, dtype, j))) << "col " << j;
          }
        }
      }
    }
  }
}

TEST_P(CpuEngineTest, FlipSwapsHalves) {
  for (DType dtype : kAllDTypes) {
    for (int dim : {4, 9, 64, 321}) {
      EmbeddingSpec cos_first = Spec(dim, dtype);
      EmbeddingSpec sin_first = cos_first;
      sin_first.flip_sin_to_cos = false;
      const auto a = MustRun(*backend_, cos_first, kSomeTimesteps);
      const auto b = MustRun(*backend_, sin_first, kSomeTimesteps);
      const int half = dim / 2;
      for (size_t n = 0; n < kSomeTimesteps.size(); ++n) {
        for (int i = 0; i < half; ++i) {
          ASSERT_EQ(ElementBytes(a, cos_first, n, i),
                    ElementBytes(b, sin_first, n, half + i));
          ASSERT_EQ(ElementBytes(a, cos_first, n, half + i),
                    ElementBytes(b, sin_first, n, i));
        }
      }
    }
  }
}

TEST_P(CpuEngineTest, OddDimLastColumnIsExactlyZero) {
  for (Precision precision : {Precision::kFloat32, Precision::kFloat64}) {
    for (DType dtype : kAllDTypes) {
      for (int dim : {1, 3, 7, 17, 255, 1281}) {
        for (bool flip : {true, false}) {
          EmbeddingSpec spec = Spec(dim, dtype, precision);
          spec.flip_sin_to_cos = flip;
          const auto out = MustRun(*backend_, spec, kSomeTimesteps);
          ASSERT_EQ(out.size(), kSomeTimesteps.size() * dim * DTypeSize(dtype));
          for (size_t n = 0; n < kSomeTimesteps.size(); ++n) {
            const auto last = ElementBytes(out, spec, n, dim - 1);
            ASSERT_TRUE(std::all_of(last.begin(), last.end(),
                                    [](uint8_t b) { return b == 0; }))
                << SpecDebugString(spec) << " row " << n;
          }
        }
      }
    }
  }
}

TEST_P(CpuEngineTest, InterleavedIsPermutedHalves) {
  for (Precision precision : {Precision::kFloat32, Precision::kFloat64}) {
    for (DType dtype : kAllDTypes) {
      for (int dim : {2, 6, 16, 34, 40, 512}) {
        for (bool flip : {true, false}) {
          EmbeddingSpec halves = Spec(dim, dtype, precision);
          halves.flip_sin_to_cos = flip;
          halves.downscale_freq_shift = 1.0;
          halves.scale = 3.0;
          if (dim == 2) halves.downscale_freq_shift = 0.0;
          EmbeddingSpec interleaved = halves;
          interleaved.layout = Layout::kInterleaved;
          const auto a = MustRun(*backend_, halves, kSomeTimesteps);
          const auto b = MustRun(*backend_, interleaved, kSomeTimesteps);
          for (size_t n = 0; n < kSomeTimesteps.size(); ++n) {
            for (int i = 0; i < dim / 2; ++i) {
              ASSERT_EQ(ElementBytes(a, halves, n, i),
                        ElementBytes(b, interleaved, n, 2 * i))
                  << SpecDebugString(interleaved);
              ASSERT_EQ(ElementBytes(a, halves, n, dim / 2 + i),
                        ElementBytes(b, interleaved, n, 2 * i + 1));
            }
          }
        }
      }
    }
  }
}

TEST_P(CpuEngineTest, LdmIsDiffusersWithFlipAndNoShift) {
  EmbeddingSpec diffusers;
  diffusers.dim = 320;
  diffusers.flip_sin_to_cos = true;
  diffusers.downscale_freq_shift = 0.0;
  diffusers.scale = 1.0;
  diffusers.max_period = 10000.0;
  EmbeddingSpec ldm;  // the defaults are the LDM convention
  ldm.dim = 320;
  EXPECT_EQ(MustRun(*backend_, ldm, kSomeTimesteps),
            MustRun(*backend_, diffusers, kSomeTimesteps));
  // DDPM is diffusers' defaults: flip=false, shift=1; not the same numbers.
  EmbeddingSpec ddpm = diffusers;
  ddpm.flip_sin_to_cos = false;
  ddpm.downscale_freq_shift = 1.0;
  EXPECT_NE(MustRun(*backend_, ldm, kSomeTimesteps),
            MustRun(*backend_, ddpm, kSomeTimesteps));
}

// fp16/bf16/fp64 outputs are the fp32 output rounded (or widened), bit for
// bit; in fp64 precision every dtype is the fp64 output rounded once.
TEST_P(CpuEngineTest, NarrowDTypesAreTheWideOutputRounded) {
  for (int dim : {3, 8, 31, 320, 1280}) {
    for (Layout layout : {Layout::kHalves, Layout::kInterleaved}) {
      if (layout == Layout::kInterleaved && dim % 2) continue;
      EmbeddingSpec spec = Spec(dim);
      spec.layout = layout;
      spec.time_factor = dim == 31 ? 1000.0 : 1.0;
      const auto f32 = MustRun(*backend_, spec, kSomeTimesteps);
      EmbeddingSpec wide = spec;
      wide.precision = Precision::kFloat64;
      wide.dtype = DType::kFloat64;
      const auto f64 = MustRun(*backend_, wide, kSomeTimesteps);
      for (DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kFloat64,
                          DType::kFloat32}) {
        EmbeddingSpec narrow = spec;
        narrow.dtype = dtype;
        const auto got = MustRun(*backend_, narrow, kSomeTimesteps);
        EmbeddingSpec narrow64 = wide;
        narrow64.dtype = dtype;
        const auto got64 = MustRun(*backend_, narrow64, kSomeTimesteps);
        for (size_t k = 0; k < kSomeTimesteps.size() * dim; ++k) {
          float v32;
          std::memcpy(&v32, f32.data() + 4 * k, 4);
          double v64;
          std::memcpy(&v64, f64.data() + 8 * k, 8);
          switch (dtype) {
            case DType::kFloat16: {
              uint16_t h, h64;
              std::memcpy(&h, got.data() + 2 * k, 2);
              std::memcpy(&h64, got64.data() + 2 * k, 2);
              ASSERT_EQ(h, FloatToHalf(v32)) << k;
              ASSERT_EQ(h64, DoubleToHalf(v64)) << k;
              break;
            }
            case DType::kBFloat16: {
              uint16_t b, b64;
              std::memcpy(&b, got.data() + 2 * k, 2);
              std::memcpy(&b64, got64.data() + 2 * k, 2);
              ASSERT_EQ(b, FloatToBFloat16(v32)) << k;
              ASSERT_EQ(b64, DoubleToBFloat16(v64)) << k;
              break;
            }
            case DType::kFloat64: {
              double d;
              std::memcpy(&d, got.data() + 8 * k, 8);
              ASSERT_EQ(d, static_cast<double>(v32)) << k;
              break;
            }
            case DType::kFloat32: {
              float f;
              std::memcpy(&f, got64.data() + 4 * k, 4);
              ASSERT_EQ(f, static_cast<float>(v64)) << k;
              break;
            }
          }
        }
      }
    }
  }
}

TEST_P(CpuEngineTest, EmptyBatchAndDimOne) {
  for (DType dtype : kAllDTypes) {
    std::vector<uint8_t> none;
    EXPECT_TRUE(
        backend_->Compute(Spec(320, dtype), {}, absl::MakeSpan(none)).ok());
    const auto out = MustRun(*backend_, Spec(1, dtype), {0.0f, 5.0f, -999.0f});
    ASSERT_EQ(out.size(), 3 * DTypeSize(dtype));
    EXPECT_TRUE(
        std::all_of(out.begin(), out.end(), [](uint8_t b) { return b == 0; }));
  }
}

TEST_P(CpuEngineTest, RepeatOnlyCopiesTheTimestep) {
  const std::vector<float> t = {0.0f, -7.5f, 0.1f, 123.25f, 65504.0f, 1e-6f};
  for (Precision precision : {Precision::kFloat32, Precision::kFloat64}) {
    for (DType dtype : kAllDTypes) {
      for (int dim : {1, 5, 64, 1000}) {
        EmbeddingSpec spec = Spec(dim, dtype, precision);
        spec.repeat_only = true;
        spec.max_period = -1;  // unused by repeat_only
        const auto out = MustRun(*backend_, spec, t);
        for (size_t n = 0; n < t.size(); ++n) {
          const double want = dtype == DType::kFloat16
                                  ? HalfToFloat(FloatToHalf(t[n]))
                              : dtype == DType::kBFloat16
                                  ? BFloat16ToFloat(FloatToBFloat16(t[n]))
                                  : static_cast<double>(t[n]);
          for (int j = 0; j < dim; ++j)
            ASSERT_EQ(Element(out, dtype, n * dim + j), want);
        }
      }
    }
  }
}

// Every dim from 1 to 80 exercises every tail length of every vector width.
TEST_P(CpuEngineTest, AllSmallDimsMatchTheReference) {
  for (int dim = 1; dim <= 80; ++dim) {
    for (Layout layout : {Layout::kHalves, Layout::kInterleaved}) {
      if (layout == Layout::kInterleaved && dim % 2) continue;
      for (DType dtype : kAllDTypes) {
        EmbeddingSpec spec = Spec(dim, dtype);
        spec.layout = layout;
        spec.flip_sin_to_cos = dim % 3 != 0;
        const auto out = MustRun(*backend_, spec, kSomeTimesteps);
        for (size_t n = 0; n < kSomeTimesteps.size(); ++n) {
          const auto ref = ReferenceRow(spec, kSomeTimesteps[n]);
          for (int j = 0; j < dim; ++j) {
            const double want = static_cast<double>(ref[j]);
            ASSERT_LE(std::fabs(Element(out, dtype, n * dim + j) - want),
                      testing::Float32PathBound(spec, kSomeTimesteps[n], want))
                << SpecDebugString(spec) << " t=" << kSomeTimesteps[n]
                << " col " << j;
          }
        }
      }
    }
  }
}

// Random specs and timesteps the golden tables never chose, against the
// long-double reference.  Seeded: a failure reproduces.
TEST_P(CpuEngineTest, RandomizedAccuracy) {
  std::mt19937_64 rng(0x7e3b + static_cast<int>(GetParam()));
  std::uniform_int_distribution<int> dim_dist(1, 2048);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::uniform_int_distribution<int> pick(0, 3);
  int checked_cases = 0;
  int64_t checked_values = 0;
  while (checked_cases < 150) {
    EmbeddingSpec spec;
    spec.dim = dim_dist(rng);
    spec.max_period = std::pow(10.0, -1.0 + 7.0 * unit(rng));  // 0.1 .. 1e6
    const int shift_kind = pick(rng);
    spec.downscale_freq_shift = shift_kind == 0   ? 0.0
                                : shift_kind == 1 ? 1.0
                                                  : -2.0 + 4.0 * unit(rng);
    spec.scale = pick(rng) < 2 ? 1.0 : -10.0 + 20.0 * unit(rng);
    const int tf_kind = pick(rng);
    spec.time_factor = tf_kind < 2    ? 1.0
                       : tf_kind == 2 ? 1000.0
                                      : 0.01 + 10.0 * unit(rng);
    spec.flip_sin_to_cos = pick(rng) < 2;
    spec.layout = pick(rng) == 0 && spec.dim % 2 == 0 ? Layout::kInterleaved
                                                      : Layout::kHalves;
    spec.repeat_only = pick(rng) == 0 && pick(rng) == 0;
    spec.dtype = kAllDTypes[pick(rng)];
    spec.precision = pick(rng) == 0 ? Precision::kFloat64 : Precision::kFloat32;
    std::vector<float> t(1 + pick(rng) * 3);
    for (float& v : t) {
      v = static_cast<float>(
          spec.time_factor == 1000.0 ? unit(rng) : -1e4 + 2e4 * unit(rng));
    }
    if (!ValidateRequest(spec, t, Limits()).ok())
      continue;  // e.g. overflowing frequencies
    const auto out = MustRun(*backend_, spec, t);
    for (size_t n = 0; n < t.size(); ++n) {
      const auto ref = ReferenceRow(spec, t[n]);
      for (int j = 0; j < spec.dim; ++j) {
        const double want = static_cast<double>(ref[j]);
        const double got = Element(out, spec.dtype, n * spec.dim + j);
        const double bound = spec.precision == Precision::kFloat32
                                 ? testing::Float32PathBound(spec, t[n], want)
                                 : testing::Float64PathBound(spec, t[n], want);
        ASSERT_FALSE(std::isnan(got)) << SpecDebugString(spec);
        ASSERT_LE(std::fabs(got - want), bound)
            << SpecDebugString(spec) << " t=" << t[n] << " col " << j << " got "
            << got << " want " << want;
        ++checked_values;
      }
    }
    ++checked_cases;
  }
  EXPECT_GT(checked_values, 100000);
}

// PyTorch's float32 op order (docs/semantics.md section 2), re-derived here
// from the guide's formula: the exponent (in the spec's exponent_order), the
// frequency and the angle are
// rounded to float32 exactly where eager PyTorch rounds them; sin/cos of that
// float32 angle are then evaluated in double.  SLEEF's u10 functions are within
// one ulp of the exact sin/cos, so every engine must land within 1 ulp of this.
// Any reordering of the angle computation moves the angle itself by an ulp
// or more (6e-5 rad at t ~ 1000) and fails here long before it would fail
// the float64 bound.
TEST_P(CpuEngineTest, FollowsPyTorchFloat32OrderWithinOneUlp) {
  std::mt19937_64 rng(424242);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (int c = 0; c < 60; ++c) {
    EmbeddingSpec spec;
    spec.dim = 2 + static_cast<int>(unit(rng) * 1300);
    spec.max_period = c % 3 == 0 ? 10000.0 : 2.0 + unit(rng) * 1e5;
    spec.downscale_freq_shift = c % 4 == 0   ? 1.0
                                : c % 4 == 1 ? 0.0
                                             : unit(rng) * 3 - 1.5;
    spec.scale = c % 5 == 0 ? 1000.0 : c % 5 == 1 ? 0.3 : 1.0;
    spec.time_factor = c % 7 == 0 ? 1000.0 : 1.0;
    spec.flip_sin_to_cos = c % 2 == 0;
    spec.exponent_order =
        c % 3 == 2 ? ExponentOrder::kSlopeFirst : ExponentOrder::kDivideLast;
    std::vector<float> t(9);
    for (float& v : t) {
      v = static_cast<float>(
          spec.time_factor == 1.0 ? -1200.0 + 2400.0 * unit(rng) : unit(rng));
    }
    if (!ValidateRequest(spec, t, Limits()).ok()) continue;
    const auto out = MustRun(*backend_, spec, t);
    const int half = spec.dim / 2;
    const float neg_log_period = static_cast<float>(-std::log(spec.max_period));
    const float divisor = static_cast<float>(half - spec.downscale_freq_shift);
    // The slope-first order rounds the slope, taken in double, once.
    const float slope = static_cast<float>(-std::log(spec.max_period) /
                                           (half - spec.downscale_freq_shift));
    for (size_t n = 0; n < t.size(); ++n) {
      const float ts = spec.time_factor == 1.0
                           ? t[n]
                           : static_cast<float>(spec.time_factor) * t[n];
      for (int i = 0; i < half; ++i) {
        const float exponent =
            spec.exponent_order == ExponentOrder::kSlopeFirst
                ? static_cast<float>(i) * slope
                : neg_log_period * static_cast<float>(i) / divisor;
        const float f =
            static_cast<float>(std::exp(static_cast<double>(exponent)));
        float a = ts * f;
        if (spec.scale != 1.0) a = static_cast<float>(spec.scale) * a;
        const float want_sin =
            static_cast<float>(std::sin(static_cast<double>(a)));
        const float want_cos =
            static_cast<float>(std::cos(static_cast<double>(a)));
        const float got_first =
            static_cast<float>(Element(out, spec.dtype, n * spec.dim + i));
        const float got_second = static_cast<float>(
            Element(out, spec.dtype, n * spec.dim + half + i));
        const float got_sin = spec.flip_sin_to_cos ? got_second : got_first;
        const float got_cos = spec.flip_sin_to_cos ? got_first : got_second;
        ASSERT_LE(testing::UlpDistance(got_sin, want_sin), 1)
            << SpecDebugString(spec) << " t=" << t[n] << " i=" << i
            << " angle=" << a;
        ASSERT_LE(testing::UlpDistance(got_cos, want_cos), 1)
            << SpecDebugString(spec) << " t=" << t[n] << " i=" << i
            << " angle=" << a;
      }
    }
  }
}

// LongCat-AudioDiT's table (H = 128, shift 1): the two exponent orders round
// many of its frequencies differently, and the backend's table cache keeps
// them apart.
TEST_P(CpuEngineTest, ExponentOrdersGiveTheirOwnTables) {
  EmbeddingSpec spec;
  spec.dim = 256;
  spec.flip_sin_to_cos = false;
  spec.downscale_freq_shift = 1.0;
  const std::vector<float> t = {999.0f};
  const std::vector<float> divide_last_freqs = Float32Frequencies(spec);
  const auto divide_last = MustRun(*backend_, spec, t);
  spec.exponent_order = ExponentOrder::kSlopeFirst;
  const std::vector<float> slope_first_freqs = Float32Frequencies(spec);
  const auto slope_first = MustRun(*backend_, spec, t);
  int different = 0;
  for (int i = 0; i < 128; ++i) {
    different += divide_last_freqs[i] != slope_first_freqs[i];
    // Each is the correctly rounded exp of its own float32 exponent.
    const float slope = static_cast<float>(-std::log(10000.0) / 127.0);
    EXPECT_EQ(slope_first_freqs[i],
              static_cast<float>(
                  std::exp(static_cast<double>(static_cast<float>(i) * slope))))
        << i;
  }
  EXPECT_GE(different, 20);
  int columns = 0;
  for (int j = 0; j < 256; ++j) {
    columns += Element(divide_last, spec.dtype, j) !=
               Element(slope_first, spec.dtype, j);
  }
  EXPECT_GE(columns, 20);
}

// GCC defines __SANITIZE_ADDRESS__ under -fsanitize=address; clang 14 only
// answers __has_feature.
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEMB_TEST_UNDER_CLANG_ASAN 1
#endif
#endif

// sin/cos of every float32 angle within 1 ulp of the correctly rounded value
// (glibc's double sin/cos rounded to float), over about two million angles
// up to 4e6 rad of both signs.  In a 64-column LDM spec each frequency is
// 0.75x the previous one, so vectors mix small and large angles and SLEEF
// runs both of its argument reductions (Cody-Waite while every lane is below
// 125 rad, Payne-Hanek otherwise).  The angles are the engine's own:
// fl32(t * f_i) with the backend's frequency table.
TEST_P(CpuEngineTest, SinCosWithinOneUlpUpToAMillionRadians) {
#if defined(__SANITIZE_ADDRESS__) || defined(TEMB_TEST_UNDER_CLANG_ASAN)
  constexpr int kRows = 8192;  // AddressSanitizer slows this test ~8x
#else
  constexpr int kRows = 65536;  // Limits().max_batch
#endif
  EmbeddingSpec spec = Spec(64);
  spec.flip_sin_to_cos = false;
  const int half = spec.dim / 2;
  std::mt19937_64 rng(20240611);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<float> t(kRows);
  for (int n = 0; n < kRows; ++n) {
    const double u = unit(rng);
    // Uniform in [0, 1e6) for half of the rows, log-uniform in [1e-3, 1e6)
    // for most others, up to 4e6 for 1 in 16; every other row negated.
    double v = n % 2 == 0 ? 1e6 * u : std::pow(10.0, -3.0 + 9.0 * u);
    if (n % 16 == 15) v = 4e6 * u;
    t[n] = static_cast<float>(n % 4 >= 2 ? -v : v);
  }
  const std::vector<float> freqs = Float32Frequencies(spec);
  const auto out = MustRun(*backend_, spec, t);
  ASSERT_EQ(out.size(), static_cast<size_t>(kRows) * spec.dim * 4);
  int64_t not_nearest = 0;
  for (int n = 0; n < kRows; ++n) {
    for (int i = 0; i < half; ++i) {
      const float a = t[n] * freqs[i];
      const float want_sin =
          static_cast<float>(std::sin(static_cast<double>(a)));
      const float want_cos =
          static_cast<float>(std::cos(static_cast<double>(a)));
      float got_sin, got_cos;
      std::memcpy(&got_sin, out.data() + 4 * (n * spec.dim + i), 4);
      std::memcpy(&got_cos, out.data() + 4 * (n * spec.dim + half + i), 4);
      const int64_t sin_ulp = testing::UlpDistance(got_sin, want_sin);
      const int64_t cos_ulp = testing::UlpDistance(got_cos, want_cos);
      ASSERT_LE(sin_ulp, 1) << "sin " << a << ": " << got_sin << " vs "
                            << want_sin << " (t=" << t[n] << ", i=" << i << ")";
      ASSERT_LE(cos_ulp, 1) << "cos " << a << ": " << got_cos << " vs "
                            << want_cos << " (t=" << t[n] << ", i=" << i << ")";
      not_nearest += (sin_ulp != 0) + (cos_ulp != 0);
    }
  }
  // SLEEF's u10 (the scalar and SSE2 engines, and angles beyond 2^20) is
  // not correctly rounded in about 4% of these angles, the double path of
  // the AVX2/AVX-512 engines almost never; a systematic error (a wrong
  // reduction, a swapped lane) would move far more.
  const int64_t total = int64_t{2} * kRows * half;
  EXPECT_LT(not_nearest, total / 10) << not_nearest << " of " << total;
  RecordProperty("not_correctly_rounded", std::to_string(not_nearest));
}

// Threads split rows; each row is computed by the same code either way.
TEST_P(CpuEngineTest, ThreadCountDoesNotChangeResults) {
  std::vector<float> t(517);
  for (size_t n = 0; n < t.size(); ++n)
    t[n] = static_cast<float>(n) * 1.93f - 37.0f;
  for (Precision precision : {Precision::kFloat32, Precision::kFloat64}) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      for (bool repeat : {false, true}) {
        EmbeddingSpec spec = Spec(1280, dtype, precision);
        spec.repeat_only = repeat;
        const auto one = MustRun(*backend_, spec, t);
        for (int threads : {2, 5}) {
          auto many = Engine(GetParam(), threads);
          EXPECT_EQ(MustRun(*many, spec, t), one) << threads << " threads";
        }
      }
    }
  }
}

// Runs of equal timesteps are computed once and copied; every row must still
// be the row its timestep gives alone, whatever the runs, the row ranges of
// the threads, the dtype and the precision.  -0 and +0 are different
// timesteps (sin(-0) = -0).
TEST_P(CpuEngineTest, RepeatedTimestepsGiveTheSameRowsAsAlone) {
  std::vector<float> t = {5, 5, 5, 999, 0.0f, -0.0f, -0.0f, 0.0f, 999, 999, 5};
  for (int k = 0; k < 300; ++k) t.push_back(k < 200 ? 640.5f : 0.25f * k);
  t.push_back(7);
  for (Precision precision : {Precision::kFloat32, Precision::kFloat64}) {
    for (DType dtype : {DType::kFloat32, DType::kFloat16}) {
      EmbeddingSpec spec = Spec(1281, dtype, precision);
      spec.flip_sin_to_cos = false;  // sin first: the sign of zero shows
      const size_t row_bytes = static_cast<size_t>(spec.row_bytes());
      for (int threads : {1, 3}) {
        const auto together = MustRun(*Engine(GetParam(), threads), spec, t);
        ASSERT_EQ(together.size(), t.size() * row_bytes);
        for (size_t n = 0; n < t.size(); ++n) {
          const auto alone = MustRun(*backend_, spec, {t[n]});
          ASSERT_EQ(std::memcmp(together.data() + n * row_bytes, alone.data(),
                                row_bytes),
                    0)
              << "row " << n << " t=" << t[n] << ", " << threads << " threads, "
              << DTypeName(dtype);
        }
      }
    }
  }
}

TEST_P(CpuEngineTest, ConcurrentCallersGetTheirOwnResults) {
  auto shared = Engine(GetParam(), 2);
  std::vector<EmbeddingSpec> specs;
  for (int k = 0; k < 6; ++k) {
    EmbeddingSpec spec = Spec(64 + 96 * k, kAllDTypes[k % 4]);
    spec.max_period = 100.0 * (k + 1);  // different frequency tables
    specs.push_back(spec);
  }
  std::vector<float> t(300);
  for (size_t n = 0; n < t.size(); ++n) t[n] = static_cast<float>(n);
  std::vector<std::vector<uint8_t>> expected;
  for (const auto& spec : specs)
    expected.push_back(MustRun(*backend_, spec, t));
  std::vector<int> mismatches(specs.size(), 0);
  std::vector<std::thread> callers;
  for (size_t k = 0; k < specs.size(); ++k) {
    callers.emplace_back([&, k] {
      for (int rep = 0; rep < 10; ++rep) {
        auto out = RunRequest(*shared, specs[(k + rep) % specs.size()], t);
        if (!out.ok() || *out != expected[(k + rep) % specs.size()])
          ++mismatches[k];
      }
    });
  }
  for (auto& c : callers) c.join();
  for (size_t k = 0; k < specs.size(); ++k)
    EXPECT_EQ(mismatches[k], 0) << "caller " << k;
}

INSTANTIATE_TEST_SUITE_P(Engines, CpuEngineTest, ::testing::ValuesIn(kAllIsas),
                         testing::IsaTestName);

// Every SIMD engine against the scalar engine.  SLEEF's vector sincosf picks
// its argument reduction per vector (the precise one as soon as one lane is
// large), and the FMA engines run its FMA variant, so engines may differ by
// 1 ulp of float32 in a small fraction of elements, never more.  The fp64
// path is shared code: bit for bit.
class EngineParityTest : public ::testing::TestWithParam<CpuIsa> {};

TEST_P(EngineParityTest, MatchesScalarEngineWithinOneUlp) {
  const CpuIsa isa = GetParam();
  if (!testing::IsaSupported(isa)) {
    GTEST_SKIP() << "this CPU cannot run the " << CpuIsaName(isa) << " engine";
  }
  auto scalar = *CreateCpuBackendForIsa(CpuIsa::kScalar, 1);
  auto simd = *CreateCpuBackendForIsa(isa, 1);
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> t_dist(-2e4f, 2e4f);
  std::vector<float> t(64);
  for (float& v : t) v = t_dist(rng);
  t[0] = 0.0f;
  t[1] = 999.0f;
  std::vector<float> flux_t(t.size());
  for (size_t n = 0; n < t.size(); ++n) flux_t[n] = std::fabs(t[n]) / 2e4f;
  int64_t differing = 0, total = 0;
  for (int dim : {1, 2, 7, 15, 16, 17, 33, 256, 320, 1280, 2047}) {
    for (Layout layout : {Layout::kHalves, Layout::kInterleaved}) {
      if (layout == Layout::kInterleaved && dim % 2) continue;
      for (Precision precision : {Precision::kFloat32, Precision::kFloat64}) {
        EmbeddingSpec spec = Spec(dim, DType::kFloat32, precision);
        spec.layout = layout;
        spec.scale = dim % 2 ? 1.0 : 0.75;
        spec.time_factor = dim == 320 ? 1000.0 : 1.0;
        const std::vector<float>& ts = dim == 320 ? flux_t : t;
        const auto a = MustRun(*scalar, spec, ts);
        const auto b = MustRun(*simd, spec, ts);
        ASSERT_EQ(a.size(), b.size());
        if (precision == Precision::kFloat64) {
          ASSERT_EQ(a, b) << SpecDebugString(spec);
          continue;
        }
        for (size_t k = 0; k < ts.size() * dim; ++k) {
          float x, y;
          std::memcpy(&x, a.data() + 4 * k, 4);
          std::memcpy(&y, b.data() + 4 * k, 4);
          ASSERT_LE(testing::UlpDistance(x, y), 1)
              << SpecDebugString(spec) << " element " << k;
          differing += x != y;
          ++total;
        }
      }
    }
  }
  // A systematic difference (a wrong op order, a contracted multiply) would
  // move far more than a few percent of the elements.  The AVX2 and AVX-512
  // engines round correctly below 2^20 rad where SLEEF's u10 (the scalar
  // engine) is 1 ulp off: about 4% of the elements here.
  EXPECT_LT(differing, total / 20) << differing << " of " << total;
}

INSTANTIATE_TEST_SUITE_P(Engines, EngineParityTest,
                         ::testing::Values(CpuIsa::kSse2, CpuIsa::kAvx2,
                                           CpuIsa::kAvx512),
                         testing::IsaTestName);

// GNU OpenMP's thread pool does not survive fork(): a child of a process
// that has run a team must compute on its own thread, not wait for the
// parent's pool (a data-loader worker forked from a pipeline that computed
// in process).  The parent's team needs two threads for the test to
// matter: OMP_THREAD_LIMIT=1 would make it pass either way.
TEST(CpuBackendForkTest, ChildOfAThreadedProcessComputes) {
  auto backend = CreateCpuBackend(2);
  const EmbeddingSpec spec = Spec(1280);
  std::vector<float> t(1024);
  for (size_t n = 0; n < t.size(); ++n) t[n] = static_cast<float>(n) * 0.75f;
  const std::vector<uint8_t> want = MustRun(*backend, spec, t);  // a team
  const pid_t child = fork();
  ASSERT_NE(child, -1);
  if (child == 0) {
    const auto out = RunRequest(*backend, spec, t);
    _exit(out.ok() && *out == want ? 0 : 1);
  }
  // A child stuck on the parent's pool never exits: give it 60 s.
  int status = 0;
  pid_t done = 0;
  for (int wait = 0; wait < 600 && done == 0; ++wait) {
    done = waitpid(child, &status, WNOHANG);
    if (done == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (done == 0) {
    kill(child, SIGKILL);
    waitpid(child, &status, 0);
    FAIL() << "the forked child did not finish its computation in 60 s";
  }
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's result differs";
  EXPECT_EQ(MustRun(*backend, spec, t), want);  // the parent's team is fine
}

TEST(CpuIsaTest, SupportedLevelsAndDefault) {
  const auto isas = SupportedCpuIsas();
  ASSERT_FALSE(isas.empty());
  EXPECT_EQ(isas.front(), CpuIsa::kScalar);
  EXPECT_TRUE(std::is_sorted(isas.begin(), isas.end()));
  EXPECT_EQ(CreateCpuBackendForIsa(CpuIsa::kScalar, 1).status().code(),
            absl::StatusCode::kOk);
  for (CpuIsa isa : kAllIsas) {
    if (!testing::IsaSupported(isa)) {
      EXPECT_EQ(CreateCpuBackendForIsa(isa, 1).status().code(),
                absl::StatusCode::kFailedPrecondition);
    }
  }
  // TEMB_CPU_ISA lowers the default (ctest runs this once with it set).
  CpuIsa expected = isas.back();
  if (const char* forced = std::getenv("TEMB_CPU_ISA")) {
    for (CpuIsa isa : isas) {
      if (CpuIsaName(isa) == forced) expected = isa;
    }
  }
  EXPECT_EQ(DefaultCpuIsa(), expected);
  EXPECT_NE(
      CreateCpuBackend(1)->device().find(std::string(CpuIsaName(expected))),
      std::string::npos);
}

}  // namespace
}  // namespace temb
