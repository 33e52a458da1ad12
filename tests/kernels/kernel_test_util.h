// Helpers shared by the kernel tests: run a backend, decode its bytes, and an
// independent long-double evaluation of the embedding.
#ifndef TEMB_TESTS_KERNELS_KERNEL_TEST_UTIL_H_
#define TEMB_TESTS_KERNELS_KERNEL_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "temb/kernels/backend.h"
#include "temb/kernels/cpu_backend.h"
#include "temb/kernels/dtype.h"
#include "temb/kernels/embedding_spec.h"

namespace temb {
namespace testing {

inline constexpr DType kAllDTypes[] = {DType::kFloat32, DType::kFloat16,
                                       DType::kBFloat16, DType::kFloat64};
inline constexpr CpuIsa kAllIsas[] = {CpuIsa::kScalar, CpuIsa::kSse2,
                                      CpuIsa::kAvx2, CpuIsa::kAvx512};

inline bool IsaSupported(CpuIsa isa) {
  for (CpuIsa s : SupportedCpuIsas()) {
    if (s == isa) return true;
  }
  return false;
}

// Names parameterized tests after the engine: ".../avx2".
inline std::string IsaTestName(const ::testing::TestParamInfo<CpuIsa>& param) {
  return std::string(CpuIsaName(param.param));
}

// Validates the request, then computes it.
inline absl::StatusOr<std::vector<uint8_t>> RunRequest(
    Backend& backend, const EmbeddingSpec& spec, const std::vector<float>& t) {
  absl::Status valid = ValidateRequest(spec, t, Limits());
  if (!valid.ok()) return valid;
  // Filled with a pattern no backend writes, because servers hand backends
  // uninitialised memory: every byte must be written, zero columns included.
  std::vector<uint8_t> out(OutputBytes(spec, static_cast<int64_t>(t.size())),
                           0xA5);
  absl::Status status = backend.Compute(spec, t, absl::MakeSpan(out));
  if (!status.ok()) return status;
  return out;
}

// The value of element `index` of a buffer of `dtype`.
inline double Element(const std::vector<uint8_t>& bytes, DType dtype,
                      size_t index) {
  return ElementAsDouble(bytes.data(), dtype, static_cast<int64_t>(index));
}

// Half an ulp of `dtype`, relative, plus its smallest subnormal step: what
// rounding a value of magnitude |x| to the dtype may cost.
inline double RoundingAllowance(DType dtype, double x) {
  switch (dtype) {
    case DType::kFloat32:
      return std::ldexp(std::fabs(x), -24) + std::ldexp(1.0, -149);
    case DType::kFloat16:
      return std::ldexp(std::fabs(x), -11) + std::ldexp(1.0, -25);
    case DType::kBFloat16:
      return std::ldexp(std::fabs(x), -8) + std::ldexp(1.0, -133);
    case DType::kFloat64:
      return std::ldexp(std::fabs(x), -53);
  }
  return 0;
}

// The accuracy contract of the float32 path against a float64 evaluation
// (docs/semantics.md section 2), widened by the rounding of the output dtype.
// The guide's 5e-7 * |scale * t| assumes frequencies <= 1 (max_period >= 1).
// With max_period < 1 they grow to f_max = exp(e_max) and the float32
// exponent's rounding error is amplified by |e_max|, so the term scales by
// f_max * (1 + e_max).
inline double Float32PathBound(const EmbeddingSpec& spec, float t,
                               double reference) {
  double growth = 1.0;
  const int half = spec.dim / 2;
  if (!spec.repeat_only && half > 1) {
    const double e_max = std::max(0.0, -std::log(spec.max_period) * (half - 1) /
                                           (half - spec.downscale_freq_shift));
    growth = std::exp(e_max) * (1.0 + e_max);
  }
  return 1e-6 + 5e-7 * growth * std::fabs(spec.scale * spec.time_factor * t) +
         RoundingAllowance(spec.dtype, reference);
}

// The fp64 path rounds once: the dtype's rounding plus double-precision noise
// of the angle.
inline double Float64PathBound(const EmbeddingSpec& spec, float t,
                               double reference) {
  return 1e-14 * (1.0 + std::fabs(spec.scale * spec.time_factor * t)) +
         RoundingAllowance(spec.dtype, reference);
}

// An evaluation of the general form in long double, written straight from
// the definition in embedding_spec.h and sharing no code with the backends.
inline std::vector<long double> ReferenceRow(const EmbeddingSpec& spec,
                                             float t) {
  std::vector<long double> row(spec.dim, 0.0L);
  if (spec.repeat_only) {
    for (auto& v : row) v = t;
    return row;
  }
  const int half = spec.dim / 2;
  const long double ts = static_cast<long double>(spec.time_factor) * t;
  for (int i = 0; i < half; ++i) {
    const long double exponent =
        -std::log(static_cast<long double>(spec.max_period)) * i /
        (half - static_cast<long double>(spec.downscale_freq_shift));
    const long double angle =
        static_cast<long double>(spec.scale) * (ts * std::exp(exponent));
    const long double s = std::sin(angle);
    const long double c = std::cos(angle);
    const long double first = spec.flip_sin_to_cos ? c : s;
    const long double second = spec.flip_sin_to_cos ? s : c;
    if (spec.layout == Layout::kInterleaved) {
      row[2 * i] = first;
      row[2 * i + 1] = second;
    } else {
      row[i] = first;
      row[half + i] = second;
    }
  }
  return row;
}

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Distance in units in the last place between two finite floats.
inline int64_t UlpDistance(float a, float b) {
  auto ordered = [](float f) -> int64_t {
    const int64_t u = FloatBits(f);
    return (u & 0x80000000) ? -(u & 0x7fffffff) : u;
  };
  const int64_t d = ordered(a) - ordered(b);
  return d < 0 ? -d : d;
}

}  // namespace testing
}  // namespace temb

#endif  // TEMB_TESTS_KERNELS_KERNEL_TEST_UTIL_H_
