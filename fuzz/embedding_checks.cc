#include "embedding_checks.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "temb/kernels/dtype.h"

namespace temb::fuzz {
namespace {

double Element(absl::string_view bytes, DType dtype, int64_t index) {
  return ElementAsDouble(bytes.data(), dtype, index);
}

// t as repeat_only stores it: rounded once from float to the output dtype.
double Rounded(float t, DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return HalfToFloat(FloatToHalf(t));
    case DType::kBFloat16:
      return BFloat16ToFloat(FloatToBFloat16(t));
    case DType::kFloat32:
    case DType::kFloat64:
      return t;
  }
  return NAN;
}

// Bound on |sin^2 + cos^2 - 1| after each value is rounded to `dtype`
// (about 3 x the unit roundoff, with room for the 1-ulp sin/cos).
double PythagorasTolerance(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return 2e-3;
    case DType::kBFloat16:
      return 1.6e-2;
    case DType::kFloat32:
    case DType::kFloat64:
      return 1e-5;
  }
  return 0;
}

std::string Where(const EmbeddingSpec& spec, int64_t row, int64_t col,
                  float t) {
  return absl::StrCat(" at [", row, ", ", col, "] (t=", t, ") for ",
                      SpecDebugString(spec));
}

}  // namespace

Limits FuzzLimits() {
  Limits limits;
  limits.max_dim = 4096;
  limits.max_batch = 1024;
  limits.max_output_bytes = int64_t{1} << 20;
  return limits;
}

void Fail(absl::string_view what) {
  std::fprintf(stderr, "invariant violated: %.*s\n",
               static_cast<int>(what.size()), what.data());
  std::abort();
}

void CheckRejection(const absl::Status& status) {
  const absl::StatusCode code = status.code();
  TEMB_FUZZ_CHECK(
      code == absl::StatusCode::kInvalidArgument ||
          code == absl::StatusCode::kNotFound ||
          code == absl::StatusCode::kResourceExhausted,
      absl::StrCat("unexpected rejection code: ", status.ToString()));
  TEMB_FUZZ_CHECK(!status.message().empty(), "rejection without a message");
}

void CheckEmbedding(const EmbeddingSpec& spec,
                    absl::Span<const float> timesteps,
                    absl::string_view bytes) {
  const int64_t rows = static_cast<int64_t>(timesteps.size());
  TEMB_FUZZ_CHECK(
      static_cast<int64_t>(bytes.size()) == OutputBytes(spec, rows),
      absl::StrCat("output has ", bytes.size(), " bytes, expected ",
                   OutputBytes(spec, rows), " for ", SpecDebugString(spec)));
  const int dim = spec.dim;
  const int half = spec.half_dim();
  for (int64_t n = 0; n < rows; ++n) {
    const float t = timesteps[n];
    auto at = [&](int64_t col) {
      return Element(bytes, spec.dtype, n * dim + col);
    };
    for (int64_t j = 0; j < dim; ++j) {
      const double v = at(j);
      TEMB_FUZZ_CHECK(std::isfinite(v), absl::StrCat("non-finite value ", v,
                                                     Where(spec, n, j, t)));
      if (spec.repeat_only) {
        TEMB_FUZZ_CHECK(v == Rounded(t, spec.dtype),
                        absl::StrCat("repeat_only value ", v, " != t",
                                     Where(spec, n, j, t)));
      } else {
        TEMB_FUZZ_CHECK(std::fabs(v) <= 1.0,
                        absl::StrCat("|value| > 1: ", v, Where(spec, n, j, t)));
      }
    }
    if (spec.repeat_only) continue;
    if (dim % 2 == 1) {
      TEMB_FUZZ_CHECK(at(dim - 1) == 0.0,
                      absl::StrCat("odd dim: last column is ", at(dim - 1),
                                   ", not 0", Where(spec, n, dim - 1, t)));
    }
    const bool interleaved = spec.layout == Layout::kInterleaved;
    for (int i = 0; i < half; ++i) {
      const int first = interleaved ? 2 * i : i;
      const int second = interleaved ? 2 * i + 1 : half + i;
      const double c = at(spec.flip_sin_to_cos ? first : second);
      const double s = at(spec.flip_sin_to_cos ? second : first);
      const double norm = s * s + c * c;
      TEMB_FUZZ_CHECK(std::fabs(norm - 1.0) <= PythagorasTolerance(spec.dtype),
                      absl::StrCat("sin^2 + cos^2 = ", norm, " for frequency ",
                                   i, Where(spec, n, first, t)));
      if (t == 0.0f) {
        TEMB_FUZZ_CHECK(
            c == 1.0 && s == 0.0,
            absl::StrCat("t = 0 must give cos 1, sin 0; got ", c, ", ", s,
                         " for frequency ", i, Where(spec, n, first, t)));
      }
    }
  }
}

}  // namespace temb::fuzz
