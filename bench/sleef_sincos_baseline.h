// SLEEF's 1-ulp vector sincosf over an array of angles: the library baseline
// the engines' own sin/cos is timed against (kernel_benchmark.cc).  Each
// function is compiled with its instruction set's flags; call it only on a
// CPU that has them.
#ifndef TEMB_BENCH_SLEEF_SINCOS_BASELINE_H_
#define TEMB_BENCH_SLEEF_SINCOS_BASELINE_H_

#include <cstdint>

namespace temb {
namespace bench {

// n must be a multiple of 16.
void SleefSinCosAvx2(const float* angles, int64_t n, float* sin_out,
                     float* cos_out);
void SleefSinCosAvx512(const float* angles, int64_t n, float* sin_out,
                       float* cos_out);

}  // namespace bench
}  // namespace temb

#endif  // TEMB_BENCH_SLEEF_SINCOS_BASELINE_H_
