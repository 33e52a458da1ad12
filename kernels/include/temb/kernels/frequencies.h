// The frequency table shared by every backend, so that CPU and CUDA agree on
// f_i by construction (the table is computed here, on the host, and uploaded).
//
// Float32 precision reproduces eager PyTorch's op order:
//   e_i = fl32( fl32( fl32(-ln P) * i ) / fl32(H - shift) )
//   f_i = exp(e_i) rounded once to float32 (a correctly rounded expf: within
//         half an ulp, so within one ulp of both torch CPU's SLEEF expf and
//         CUDA's expf).
// Reordering (e.g. a precomputed slope times i) would move results by ~3e-5 at
// t ~ 1000 unless H is a power of two, which is why the order is kept.
#ifndef TEMB_KERNELS_FREQUENCIES_H_
#define TEMB_KERNELS_FREQUENCIES_H_

#include <vector>

#include "temb/kernels/embedding_spec.h"

namespace temb {

// Everything a frequency table depends on: specs with equal keys have equal
// tables, so backends cache tables by key (a server sees the same few specs
// over and over, and a table of dim 1280 takes microseconds to build).
struct FrequencyKey {
  int half_dim = 0;
  double max_period = 0;
  double shift = 0;
  Precision precision = Precision::kFloat32;

  static FrequencyKey Of(const EmbeddingSpec& spec) {
    return {spec.half_dim(), spec.max_period, spec.downscale_freq_shift,
            spec.precision};
  }
  bool operator==(const FrequencyKey& other) const {
    return half_dim == other.half_dim && max_period == other.max_period &&
           shift == other.shift && precision == other.precision;
  }
};

// H float32 frequencies in PyTorch's op order.  Requires a valid spec.
std::vector<float> Float32Frequencies(const EmbeddingSpec& spec);

// H frequencies evaluated in double: exp(-ln(P) * i / (H - shift)).
std::vector<double> Float64Frequencies(const EmbeddingSpec& spec);

// The largest value of each table, without building it (validation bounds
// the largest angle with it on every request).  Requires H >= 1.
float Float32LargestFrequency(const EmbeddingSpec& spec);
double Float64LargestFrequency(const EmbeddingSpec& spec);

// The angle step after the frequency, in float32 op order:
//   a = fl32(fl32(time_factor * t) * f), then fl32(fl32(scale) * a) when
//   scale != 1.  Shared by the scalar paths of every backend.
inline float Float32Angle(float t_scaled, float frequency, float scale,
                          bool apply_scale) {
  float a = t_scaled * frequency;
  return apply_scale ? scale * a : a;
}

}  // namespace temb

#endif  // TEMB_KERNELS_FREQUENCIES_H_
