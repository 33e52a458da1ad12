// The SSE2 engine (every x86-64 CPU): 4 lanes, SLEEF's SSE2 sincosf.
// SSE2 has no half-precision conversion instruction, so fp16 goes through
// the scalar FloatToHalf (same bits as F16C).
#include <emmintrin.h>
#include <sleef.h>

#include "cpu_kernel_impl.h"

namespace temb {
namespace cpu_sse2 {
namespace {

struct Isa {
  static constexpr int kLanes = 4;
  using V = __m128;
  static V Load(const float* p) { return _mm_loadu_ps(p); }
  static V Set1(float x) { return _mm_set1_ps(x); }
  static V Mul(V a, V b) { return _mm_mul_ps(a, b); }
  static void SinCos(V a, V* s, V* c) {
    const Sleef___m128_2 r = Sleef_sincosf4_u10sse2(a);
    *s = r.x;
    *c = r.y;
  }
  static void Interleave(V a, V b, V* lo, V* hi) {
    *lo = _mm_unpacklo_ps(a, b);
    *hi = _mm_unpackhi_ps(a, b);
  }
  static void StoreF32(V v, uint8_t* dst) {
    _mm_storeu_ps(reinterpret_cast<float*>(dst), v);
  }
  static void StoreF16(V v, uint8_t* dst) {
    alignas(16) float lanes[4];
    _mm_store_ps(lanes, v);
    uint16_t h[4];
    for (int j = 0; j < 4; ++j) h[j] = FloatToHalf(lanes[j]);
    std::memcpy(dst, h, sizeof h);
  }
  static void StoreBF16(V v, uint8_t* dst) {
    // bits + 0x7fff + (bit 16) rounds to nearest even at bit 16.  The
    // arithmetic shift keeps the result in int16 range, so the signed
    // saturating pack keeps exactly the 16 wanted bits.
    const __m128i bits = _mm_castps_si128(v);
    const __m128i odd =
        _mm_and_si128(_mm_srli_epi32(bits, 16), _mm_set1_epi32(1));
    const __m128i rounded =
        _mm_add_epi32(_mm_add_epi32(bits, _mm_set1_epi32(0x7fff)), odd);
    const __m128i packed =
        _mm_packs_epi32(_mm_srai_epi32(rounded, 16), _mm_setzero_si128());
    _mm_storel_epi64(reinterpret_cast<__m128i*>(dst), packed);
  }
  static void StoreF64(V v, uint8_t* dst) {
    double* d = reinterpret_cast<double*>(dst);
    _mm_storeu_pd(d, _mm_cvtps_pd(v));
    _mm_storeu_pd(d + 2, _mm_cvtps_pd(_mm_movehl_ps(v, v)));
  }
};

}  // namespace

void ComputeFloat32Rows(const Float32RowJob& job, const float* timesteps,
                        int64_t rows, uint8_t* out) {
  RowsForIsa<Isa>(job, timesteps, rows, out);
}

void SinCos(const float* angles, int64_t n, float* sin_out, float* cos_out) {
  SinCosForIsa<Isa>(angles, n, sin_out, cos_out);
}

}  // namespace cpu_sse2
}  // namespace temb
