// The frequency table shared by every backend, so that CPU and CUDA agree on
// f_i by construction (the table is computed here, on the host, and uploaded).
//
// Float32 precision reproduces eager PyTorch's op order, in the order the
// model's code writes the exponent (EmbeddingSpec::exponent_order):
//   divide last:  e_i = fl32( fl32( fl32(-ln P) * i ) / fl32(H - shift) )
//   slope first:  e_i = fl32( i * fl32(-ln P / (H - shift)) )
//   f_i = exp(e_i) rounded once to float32: a correctly rounded expf.
// PyTorch's own exp is not correctly rounded, and differs by platform: on
// x86 CPUs it is oneMKL's vector exp (measured with torch 2.15: at most 0.56
// ulp from exact, and a different rounding in 0.56% of float32 exponents in
// [-10, 0]); CUDA's expf is documented within 2 ulp.  A correctly rounded
// exp is within half an ulp of the exact value, so never further from any
// platform's result than that platform's own error plus half an ulp, and
// it is the same on every backend and CPU.  The two exponent
// orders round differently (by up to ~2^-20 relative in f_i for H = 128), so
// the order is kept as the model writes it.
#ifndef TEMB_KERNELS_FREQUENCIES_H_
#define TEMB_KERNELS_FREQUENCIES_H_

#include <memory>
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
  ExponentOrder exponent_order = ExponentOrder::kDivideLast;
  Precision precision = Precision::kFloat32;
  std::shared_ptr<const std::vector<double>> table;  // the spec's own

  static FrequencyKey Of(const EmbeddingSpec& spec) {
    return {spec.half_dim(),     spec.max_period, spec.downscale_freq_shift,
            spec.exponent_order, spec.precision,  spec.frequencies};
  }
  bool operator==(const FrequencyKey& other) const {
    // Tables compare by content (the same preset's table is one object, so
    // the pointer test settles the common case).
    const bool same_table =
        table == other.table ||
        (table != nullptr && other.table != nullptr && *table == *other.table);
    return half_dim == other.half_dim && max_period == other.max_period &&
           shift == other.shift && exponent_order == other.exponent_order &&
           precision == other.precision && same_table;
  }
};

// H float32 frequencies in PyTorch's op order (or the spec's table, rounded
// to float32).  Requires a valid spec.
std::vector<float> Float32Frequencies(const EmbeddingSpec& spec);

// H frequencies evaluated in double: exp(-ln(P) * i / (H - shift)), or
// exp(i * (-ln(P) / (H - shift))) when the slope comes first.
std::vector<double> Float64Frequencies(const EmbeddingSpec& spec);

// The largest magnitude of each table, without building it (validation
// bounds the largest angle with it on every request).  Requires H >= 1.
float Float32LargestFrequency(const EmbeddingSpec& spec);
double Float64LargestFrequency(const EmbeddingSpec& spec);

// Stable Audio 3's table: `count` frequencies spaced evenly in log space
// from `min` to `max`, in float32 as its module computes them:
//   ramp = torch.linspace(0, 1, count)   (float32, torch's element formula:
//          the first half counts up from 0 by step = 1 / (count - 1), the
//          second half down from 1; PyTorch's vectorised x86 CPU kernel
//          rounds a few of them differently, 9 of 128 measured)
//   f    = exp(fl32(fl32(ramp * fl32(ln max - ln min)) + fl32(ln min)))
// with a correctly rounded exp (see above).  Requires count >= 1, min and
// max > 0.
std::vector<double> LogSpacedFrequencies(int count, double min, double max);

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
