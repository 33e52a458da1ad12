// The AVX-512 engine (compiled with -mavx512f): 16 lanes, sin/cos in double
// below 2^20 rad (sincos_via_double.h) and SLEEF's AVX-512F sincosf beyond.
// Only AVX-512F instructions are used, so any AVX-512 CPU runs it.
#include <immintrin.h>
#include <sleef.h>

#include "cpu_kernel_impl.h"
#include "sincos_via_double.h"

namespace temb {
namespace cpu_avx512 {
namespace {

struct Isa {
  static constexpr int kLanes = 16;
  using V = __m512;
  static V Load(const float* p) { return _mm512_loadu_ps(p); }
  static V Set1(float x) { return _mm512_set1_ps(x); }
  static V Mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static void SinCos(V a, V* s, V* c) { SinCosViaDouble<Isa>(a, s, c); }

  // The interface of sincos_via_double.h.
  using D = __m512d;
  using I = __m512i;
  static D WidenLow(V a) { return _mm512_cvtps_pd(_mm512_castps512_ps256(a)); }
  static D WidenHigh(V a) {
    return _mm512_cvtps_pd(
        _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
  }
  static V Narrow(D low, D high) {
    const __m256d l = _mm256_castps_pd(_mm512_cvtpd_ps(low));
    const __m256d h = _mm256_castps_pd(_mm512_cvtpd_ps(high));
    return _mm512_castpd_ps(
        _mm512_insertf64x4(_mm512_castpd256_pd512(l), h, 1));
  }
  static D DSet1(double x) { return _mm512_set1_pd(x); }
  static D DMul(D a, D b) { return _mm512_mul_pd(a, b); }
  static D DFma(D a, D b, D c) { return _mm512_fmadd_pd(a, b, c); }
  static D DFnma(D a, D b, D c) { return _mm512_fnmadd_pd(a, b, c); }
  static D DSub(D a, D b) { return _mm512_sub_pd(a, b); }
  static bool AllBelow(V a, float limit) {
    return _mm512_cmp_ps_mask(_mm512_abs_ps(a), _mm512_set1_ps(limit),
                              _CMP_LT_OQ) == 0xffff;
  }
  static I QuadrantBits(D low, D high) {
    const __m256i l = _mm512_cvtepi64_epi32(_mm512_castpd_si512(low));
    const __m256i h = _mm512_cvtepi64_epi32(_mm512_castpd_si512(high));
    return _mm512_inserti64x4(_mm512_castsi256_si512(l), h, 1);
  }
  static V SelectOdd(I q, V odd, V even) {
    return _mm512_mask_blend_ps(_mm512_test_epi32_mask(q, _mm512_set1_epi32(1)),
                                even, odd);
  }
  static V NegateWhereBit1(I q, V v) {
    const I sign =
        _mm512_slli_epi32(_mm512_and_si512(q, _mm512_set1_epi32(2)), 30);
    return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(v), sign));
  }
  static I AddOne(I q) { return _mm512_add_epi32(q, _mm512_set1_epi32(1)); }
  static void SleefSinCos(V a, V* s, V* c) {
    const Sleef___m512_2 r = Sleef_sincosf16_u10avx512f(a);
    *s = r.x;
    *c = r.y;
  }
  static void Interleave(V a, V b, V* lo, V* hi) {
    // Indices >= 16 select from b.
    const __m512i lo_index = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3,
                                              18, 2, 17, 1, 16, 0);
    const __m512i hi_index = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12,
                                              27, 11, 26, 10, 25, 9, 24, 8);
    *lo = _mm512_permutex2var_ps(a, lo_index, b);
    *hi = _mm512_permutex2var_ps(a, hi_index, b);
  }
  static void StoreF32(V v, uint8_t* dst) {
    _mm512_storeu_ps(reinterpret_cast<float*>(dst), v);
  }
  static void StoreF16(V v, uint8_t* dst) {
    _mm256_storeu_si256(
        reinterpret_cast<__m256i*>(dst),
        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static void StoreBF16(V v, uint8_t* dst) {
    const __m512i bits = _mm512_castps_si512(v);
    const __m512i odd =
        _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7fff)),
                         odd),
        16);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst),
                        _mm512_cvtepi32_epi16(rounded));
  }
  static void StoreF64(V v, uint8_t* dst) {
    double* d = reinterpret_cast<double*>(dst);
    const __m256 upper =
        _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    _mm512_storeu_pd(d, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
    _mm512_storeu_pd(d + 8, _mm512_cvtps_pd(upper));
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

}  // namespace cpu_avx512
}  // namespace temb
