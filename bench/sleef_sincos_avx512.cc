// Compiled with -mavx512f: see sleef_sincos_baseline.h.
#include <immintrin.h>
#include <sleef.h>

#include "sleef_sincos_baseline.h"

namespace temb {
namespace bench {

void SleefSinCosAvx512(const float* angles, int64_t n, float* sin_out,
                       float* cos_out) {
  for (int64_t i = 0; i < n; i += 16) {
    const Sleef___m512_2 r =
        Sleef_sincosf16_u10avx512f(_mm512_loadu_ps(angles + i));
    _mm512_storeu_ps(sin_out + i, r.x);
    _mm512_storeu_ps(cos_out + i, r.y);
  }
}

}  // namespace bench
}  // namespace temb
