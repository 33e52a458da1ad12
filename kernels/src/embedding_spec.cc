#include "temb/kernels/embedding_spec.h"

#include <cfloat>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "temb/kernels/frequencies.h"

namespace temb {
namespace {

// Largest exponent whose float32 exp is finite: expf(88.72) overflows.
constexpr double kMaxFloatExponent = 88.0;

absl::Status InvalidArgument(absl::string_view message) {
  return absl::InvalidArgumentError(message);
}

std::string FormatNumber(double value) {
  return absl::StrFormat("%.9g", value);
}

// The output value a timestep becomes under repeat_only, in the output dtype.
bool RepeatedValueFinite(DType dtype, float t) {
  switch (dtype) {
    case DType::kFloat16:
      return std::isfinite(HalfToFloat(FloatToHalf(t)));
    case DType::kBFloat16:
      return std::isfinite(BFloat16ToFloat(FloatToBFloat16(t)));
    case DType::kFloat32:
    case DType::kFloat64:
      return true;
  }
  return true;
}

}  // namespace

absl::string_view LayoutName(Layout layout) {
  return layout == Layout::kInterleaved ? "interleaved" : "halves";
}

absl::string_view PrecisionName(Precision precision) {
  return precision == Precision::kFloat64 ? "fp64" : "fp32";
}

absl::string_view ExponentOrderName(ExponentOrder order) {
  return order == ExponentOrder::kSlopeFirst ? "slope_first" : "divide_last";
}

bool operator==(const EmbeddingSpec& a, const EmbeddingSpec& b) {
  return a.dim == b.dim && a.max_period == b.max_period &&
         a.flip_sin_to_cos == b.flip_sin_to_cos &&
         a.downscale_freq_shift == b.downscale_freq_shift &&
         a.scale == b.scale && a.time_factor == b.time_factor &&
         a.repeat_only == b.repeat_only &&
         a.exponent_order == b.exponent_order && a.layout == b.layout &&
         a.dtype == b.dtype && a.precision == b.precision &&
         a.timestep_dtype == b.timestep_dtype &&
         (a.frequencies == b.frequencies ||
          (a.frequencies != nullptr && b.frequencies != nullptr &&
           *a.frequencies == *b.frequencies));
}

std::string SpecDebugString(const EmbeddingSpec& spec) {
  return absl::StrCat(
      "dim=", spec.dim, " max_period=", FormatNumber(spec.max_period),
      " flip_sin_to_cos=", spec.flip_sin_to_cos ? "true" : "false",
      " downscale_freq_shift=", FormatNumber(spec.downscale_freq_shift),
      " scale=", FormatNumber(spec.scale),
      " time_factor=", FormatNumber(spec.time_factor),
      " repeat_only=", spec.repeat_only ? "true" : "false",
      spec.exponent_order == ExponentOrder::kDivideLast
          ? ""
          : absl::StrCat(" exponent_order=",
                         ExponentOrderName(spec.exponent_order)),
      " layout=", LayoutName(spec.layout), " dtype=", DTypeName(spec.dtype),
      " precision=", PrecisionName(spec.precision),
      spec.timestep_dtype == DType::kFloat32
          ? ""
          : absl::StrCat(" timestep_dtype=", DTypeName(spec.timestep_dtype)),
      spec.frequencies == nullptr
          ? ""
          : absl::StrCat(" frequencies=table[", spec.frequencies->size(), "]"));
}

int64_t OutputBytes(const EmbeddingSpec& spec, int64_t batch) {
  const int64_t row = spec.row_bytes();
  if (batch <= 0 || row <= 0) return 0;
  if (batch > std::numeric_limits<int64_t>::max() / row) {
    return std::numeric_limits<int64_t>::max();
  }
  return batch * row;
}

absl::Status ValidateSpec(const EmbeddingSpec& spec, const Limits& limits) {
  if (spec.dim < 1) {
    return InvalidArgument(absl::StrCat("dim must be in [1, ", limits.max_dim,
                                        "], got ", spec.dim));
  }
  if (spec.dim > limits.max_dim) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "dim must be in [1, ", limits.max_dim, "], got ", spec.dim));
  }
  if (spec.timestep_dtype == DType::kFloat64) {
    return InvalidArgument(
        "timestep_dtype must be fp32, fp16 or bf16, got fp64 (timesteps "
        "reach the embedding as float32)");
  }
  if (spec.repeat_only)
    return absl::OkStatus();  // no frequency parameters used
  if (spec.frequencies != nullptr) {
    // A table replaces the formula: max_period and the shift play no part.
    if (static_cast<int>(spec.frequencies->size()) != spec.half_dim()) {
      return InvalidArgument(
          absl::StrCat("frequencies must hold dim / 2 = ", spec.half_dim(),
                       " values, got ", spec.frequencies->size()));
    }
    for (size_t i = 0; i < spec.frequencies->size(); ++i) {
      const double f = (*spec.frequencies)[i];
      if (!std::isfinite(f) || (spec.precision == Precision::kFloat32 &&
                                !std::isfinite(static_cast<float>(f)))) {
        return InvalidArgument(absl::StrCat(
            "frequencies[", i, "] must be finite, got ", FormatNumber(f)));
      }
    }
  } else {
    if (!std::isfinite(spec.max_period) || spec.max_period <= 0) {
      return InvalidArgument(
          absl::StrCat("max_period must be finite and > 0, got ",
                       FormatNumber(spec.max_period)));
    }
    if (!std::isfinite(spec.downscale_freq_shift)) {
      return InvalidArgument(
          absl::StrCat("downscale_freq_shift must be finite, got ",
                       FormatNumber(spec.downscale_freq_shift)));
    }
  }
  if (!std::isfinite(spec.scale)) {
    return InvalidArgument(
        absl::StrCat("scale must be finite, got ", FormatNumber(spec.scale)));
  }
  if (!std::isfinite(spec.time_factor)) {
    return InvalidArgument(absl::StrCat("time_factor must be finite, got ",
                                        FormatNumber(spec.time_factor)));
  }
  if (spec.layout == Layout::kInterleaved && spec.dim % 2 != 0) {
    return InvalidArgument(absl::StrCat(
        "dim must be even with layout=interleaved, got ", spec.dim));
  }
  if (spec.frequencies != nullptr) return absl::OkStatus();
  const int half = spec.half_dim();
  if (half == 0) return absl::OkStatus();  // dim 1: one zero column
  const double divisor = half - spec.downscale_freq_shift;
  if (divisor == 0.0 ||
      static_cast<float>(
          half - static_cast<float>(spec.downscale_freq_shift)) == 0.0f) {
    return InvalidArgument(absl::StrCat(
        "dim / 2 - downscale_freq_shift must be non-zero (it divides the "
        "frequency exponent), got dim=",
        spec.dim,
        " downscale_freq_shift=", FormatNumber(spec.downscale_freq_shift)));
  }
  // The exponent -ln(P) * i / (H - shift) is largest in magnitude at
  // i = H - 1.  Negative, the frequencies decay and may underflow to tiny or
  // zero values: finite, and computed as PyTorch does.  Positive, they grow,
  // and past 88 the float32 exp overflows to infinity: refused.
  double max_exponent = -std::log(spec.max_period) * (half - 1) / divisor;
  if (spec.exponent_order == ExponentOrder::kSlopeFirst) {
    // The slope is rounded to float32 before it meets i.  It stays finite:
    // a non-zero divisor H - shift is at least 2^-53 in magnitude (H is an
    // integer), and |ln P| <= 745 for any positive double P, so |slope| <=
    // 745 * 2^53 ~ 7e18.
    max_exponent = static_cast<float>(-std::log(spec.max_period) / divisor) *
                   static_cast<double>(half - 1);
  }
  if (max_exponent > kMaxFloatExponent) {
    return InvalidArgument(absl::StrCat(
        "frequencies overflow: -ln(max_period) * (dim/2 - 1) / (dim/2 - "
        "downscale_freq_shift) must be <= ",
        kMaxFloatExponent, ", got ", FormatNumber(max_exponent)));
  }
  return absl::OkStatus();
}

absl::Status ValidateTimesteps(const EmbeddingSpec& spec,
                               absl::Span<const float> timesteps,
                               const Limits& limits) {
  const int64_t batch = static_cast<int64_t>(timesteps.size());
  if (batch > limits.max_batch) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "batch size (number of timesteps) must be <= ", limits.max_batch,
        ", got ", batch));
  }
  const int64_t bytes = OutputBytes(spec, batch);
  if (bytes > limits.max_output_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("output size (batch * dim * dtype bytes) must be <= ",
                     limits.max_output_bytes, " bytes, got ", bytes));
  }
  int64_t largest = -1;
  for (int64_t n = 0; n < batch; ++n) {
    const float t = timesteps[n];
    if (!std::isfinite(t)) {
      return InvalidArgument(absl::StrCat(
          "timesteps[", n, "] must be finite, got ", FormatNumber(t)));
    }
    if (largest < 0 || std::fabs(t) > std::fabs(timesteps[largest]))
      largest = n;
  }
  if (largest < 0) return absl::OkStatus();
  const float t_max = timesteps[largest];

  if (spec.repeat_only) {
    if (!RepeatedValueFinite(spec.dtype, t_max)) {
      return InvalidArgument(
          absl::StrCat("timesteps[", largest, "] = ", FormatNumber(t_max),
                       " is not representable in dtype ", DTypeName(spec.dtype),
                       " (repeat_only copies timesteps into the output)"));
    }
    return absl::OkStatus();
  }
  if (spec.half_dim() == 0) return absl::OkStatus();

  // Rounding is monotonic, so the largest |t| gives the largest angle; check
  // it with the exact operations the kernels perform.
  bool finite;
  if (spec.precision == Precision::kFloat32) {
    const float f_max = Float32LargestFrequency(spec);
    const float t_scaled =
        static_cast<float>(spec.time_factor) * std::fabs(t_max);
    const float angle = Float32Angle(
        t_scaled, f_max, static_cast<float>(spec.scale), spec.scale != 1.0);
    finite = std::isfinite(t_scaled) && std::isfinite(angle);
  } else {
    const double f_max = Float64LargestFrequency(spec);
    finite =
        std::isfinite(spec.time_factor * std::fabs(t_max) * f_max * spec.scale);
  }
  if (!finite) {
    return InvalidArgument(
        absl::StrCat("timesteps[", largest, "] = ", FormatNumber(t_max),
                     " overflows the angle time_factor * t * frequency * scale "
                     "(time_factor=",
                     FormatNumber(spec.time_factor),
                     ", scale=", FormatNumber(spec.scale), ")"));
  }
  return absl::OkStatus();
}

absl::Status ValidateRequest(const EmbeddingSpec& spec,
                             absl::Span<const float> timesteps,
                             const Limits& limits) {
  absl::Status status = ValidateSpec(spec, limits);
  if (!status.ok()) return status;
  return ValidateTimesteps(spec, timesteps, limits);
}

absl::Status PipelineTimesteps(EmbeddingSpec* spec,
                               absl::Span<float> timesteps) {
  const DType dtype = spec->timestep_dtype;
  if (dtype == DType::kFloat32) return absl::OkStatus();
  const auto round = [dtype](float value) {
    return dtype == DType::kFloat16 ? HalfToFloat(FloatToHalf(value))
                                    : BFloat16ToFloat(FloatToBFloat16(value));
  };
  // repeat_only copies t and ignores time_factor: it only gets rounded.
  const float factor =
      spec->repeat_only ? 1.0f : static_cast<float>(spec->time_factor);
  for (size_t n = 0; n < timesteps.size(); ++n) {
    const float t = timesteps[n];
    const float value = round(round(t) * factor);
    if (std::isfinite(t) && !std::isfinite(value)) {
      return InvalidArgument(absl::StrCat(
          "timesteps[", n, "] = ", FormatNumber(t), " times time_factor ",
          FormatNumber(spec->time_factor), " overflows timestep_dtype ",
          DTypeName(dtype), " (largest finite ",
          dtype == DType::kFloat16 ? "65504" : "3.39e38", ")"));
    }
    timesteps[n] = value;
  }
  if (!spec->repeat_only) spec->time_factor = 1.0;
  spec->timestep_dtype = DType::kFloat32;
  return absl::OkStatus();
}

}  // namespace temb
