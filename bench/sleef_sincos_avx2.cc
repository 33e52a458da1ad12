// Compiled with -mavx2 -mfma: see sleef_sincos_baseline.h.
#include <immintrin.h>
#include <sleef.h>

#include "sleef_sincos_baseline.h"

namespace temb {
namespace bench {

void SleefSinCosAvx2(const float* angles, int64_t n, float* sin_out,
                     float* cos_out) {
  for (int64_t i = 0; i < n; i += 8) {
    const Sleef___m256_2 r =
        Sleef_sincosf8_u10avx2(_mm256_loadu_ps(angles + i));
    _mm256_storeu_ps(sin_out + i, r.x);
    _mm256_storeu_ps(cos_out + i, r.y);
  }
}

}  // namespace bench
}  // namespace temb
