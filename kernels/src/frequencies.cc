#include "temb/kernels/frequencies.h"

#include <cmath>

namespace temb {

std::vector<float> Float32Frequencies(const EmbeddingSpec& spec) {
  const int half = spec.half_dim();
  std::vector<float> freqs(half);
  // -math.log(P) is a Python double that PyTorch rounds to the tensor dtype.
  const float neg_log_period = static_cast<float>(-std::log(spec.max_period));
  // `half - shift` is computed on Python numbers (double), then rounded.
  const float divisor = static_cast<float>(half - spec.downscale_freq_shift);
  for (int i = 0; i < half; ++i) {
    const float exponent = (neg_log_period * static_cast<float>(i)) / divisor;
    // exp in double then one rounding: a correctly rounded expf.
    freqs[i] = static_cast<float>(std::exp(static_cast<double>(exponent)));
  }
  return freqs;
}

std::vector<double> Float64Frequencies(const EmbeddingSpec& spec) {
  const int half = spec.half_dim();
  std::vector<double> freqs(half);
  const double neg_log_period = -std::log(spec.max_period);
  const double divisor = half - spec.downscale_freq_shift;
  for (int i = 0; i < half; ++i) {
    freqs[i] = std::exp(neg_log_period * i / divisor);
  }
  return freqs;
}

}  // namespace temb
