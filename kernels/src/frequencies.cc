#include "temb/kernels/frequencies.h"

#include <cmath>

namespace temb {
namespace {

// The float32 exponent e_i in the spec's op order (ExponentOrder):
//   divide last:  e_i = fl32(fl32(c * i) / d),
//                 c = fl32(-ln P), d = fl32(H - shift)
//   slope first:  e_i = fl32(i * s),  s = fl32(-ln P / (H - shift))
struct Float32Exponent {
  explicit Float32Exponent(const EmbeddingSpec& spec)
      : Float32Exponent(spec.exponent_order == ExponentOrder::kSlopeFirst,
                        -std::log(spec.max_period),
                        spec.half_dim() - spec.downscale_freq_shift) {}

  // -math.log(P) is a Python double that PyTorch rounds to the tensor
  // dtype; `half - shift` is computed on Python numbers, then rounded; a
  // slope computed first is a Python double as well.  (One log per table
  // or per request's validation.)
  Float32Exponent(bool slope_first_order, double neg_log_p, double shifted_half)
      : slope_first(slope_first_order),
        neg_log_period(static_cast<float>(neg_log_p)),
        divisor(static_cast<float>(shifted_half)),
        slope(static_cast<float>(neg_log_p / shifted_half)) {}

  float Frequency(int i) const {
    const float exponent =
        slope_first ? static_cast<float>(i) * slope
                    : (neg_log_period * static_cast<float>(i)) / divisor;
    // exp in double then one rounding: a correctly rounded expf.
    return static_cast<float>(std::exp(static_cast<double>(exponent)));
  }

  bool slope_first;
  float neg_log_period;
  float divisor;
  float slope;
};

struct Float64Exponent {
  explicit Float64Exponent(const EmbeddingSpec& spec)
      : slope_first(spec.exponent_order == ExponentOrder::kSlopeFirst),
        neg_log_period(-std::log(spec.max_period)),
        divisor(spec.half_dim() - spec.downscale_freq_shift) {}

  double Frequency(int i) const {
    return std::exp(slope_first ? i * (neg_log_period / divisor)
                                : neg_log_period * i / divisor);
  }

  bool slope_first;
  double neg_log_period;
  double divisor;
};

}  // namespace

std::vector<float> Float32Frequencies(const EmbeddingSpec& spec) {
  if (spec.frequencies != nullptr) {
    return std::vector<float>(spec.frequencies->begin(),
                              spec.frequencies->end());
  }
  const Float32Exponent exponent(spec);
  std::vector<float> freqs(spec.half_dim());
  for (int i = 0; i < spec.half_dim(); ++i) freqs[i] = exponent.Frequency(i);
  return freqs;
}

std::vector<double> Float64Frequencies(const EmbeddingSpec& spec) {
  if (spec.frequencies != nullptr) return *spec.frequencies;
  const Float64Exponent exponent(spec);
  std::vector<double> freqs(spec.half_dim());
  for (int i = 0; i < spec.half_dim(); ++i) freqs[i] = exponent.Frequency(i);
  return freqs;
}

// Every rounding step of the exponent is monotonic in i, and so is exp: the
// largest frequency is the first or the last one.
float Float32LargestFrequency(const EmbeddingSpec& spec) {
  if (spec.frequencies != nullptr) {
    float largest = 0;
    for (const double f : *spec.frequencies) {
      largest = std::fmax(largest, std::fabs(static_cast<float>(f)));
    }
    return largest;
  }
  const Float32Exponent exponent(spec);
  return std::fmax(exponent.Frequency(0),
                   exponent.Frequency(spec.half_dim() - 1));
}

double Float64LargestFrequency(const EmbeddingSpec& spec) {
  if (spec.frequencies != nullptr) {
    double largest = 0;
    for (const double f : *spec.frequencies) {
      largest = std::fmax(largest, std::fabs(f));
    }
    return largest;
  }
  const Float64Exponent exponent(spec);
  return std::fmax(exponent.Frequency(0),
                   exponent.Frequency(spec.half_dim() - 1));
}

std::vector<double> LogSpacedFrequencies(int count, double min, double max) {
  // torch.linspace(0, 1, count) in float32 by its element formula: step
  // first, then start + step * i below the halfway index and end - step *
  // (count - 1 - i) from it on, so both ends are exact.
  const float step = count > 1 ? 1.0f / static_cast<float>(count - 1) : 0.0f;
  const int halfway = count / 2;
  // The Python scalars, rounded to float32 by the tensor ops.
  const float span = static_cast<float>(std::log(max) - std::log(min));
  const float offset = static_cast<float>(std::log(min));
  std::vector<double> freqs(count);
  for (int i = 0; i < count; ++i) {
    const float ramp = i < halfway
                           ? 0.0f + step * static_cast<float>(i)
                           : 1.0f - step * static_cast<float>(count - 1 - i);
    const float exponent = ramp * span + offset;
    freqs[i] = static_cast<float>(std::exp(static_cast<double>(exponent)));
  }
  return freqs;
}

}  // namespace temb
