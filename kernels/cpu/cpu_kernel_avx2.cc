// The AVX2 engine (compiled with -mavx2 -mfma -mf16c): 8 lanes, sin/cos
// evaluated in double (below), F16C conversions for fp16.
#include <immintrin.h>
#include <sleef.h>

#include "cpu/cpu_kernel_impl.h"

namespace temb {
namespace cpu_avx2 {
namespace {

// Angles below this magnitude take the double-precision path.  Its two-term
// pi/2 reduction stays exact to far below float resolution well past 2^20
// (|q| * 1e-33 of representation error); beyond it SLEEF's Payne-Hanek
// reduction is used.  Diffusion angles are below 1e4.
constexpr float kDoublePathLimit = 1048576.0f;  // 2^20

// sin and cos of four float32 angles (widened to double, exact), to double
// accuracy ~1e-11: Cody-Waite reduction by a two-term pi/2 with FMA, then
// Taylor polynomials on [-pi/4, pi/4] (truncation < 8e-12) and the quadrant
// swap/sign.  Rounded to float32 this is correctly rounded except in rare
// near-halfway cases (1 ulp), i.e. at least as accurate as SLEEF's u10.
// Why: SLEEF's u10 sincosf leaves its cheap reduction for any vector holding
// a lane >= 125, and its Payne-Hanek path costs ~5x; the columns of the
// highest frequencies (a fifth of a row at t ~ 1000) always hit it.  This
// path costs the same as SLEEF's cheap one at every magnitude.
void SinCosDouble(__m256d a, __m256d* s, __m256d* c) {
  // Adding 1.5 * 2^52 rounds to an integer (ties to even) and leaves it, as
  // two's complement, in the low mantissa bits.
  const __m256d magic = _mm256_set1_pd(6755399441055744.0);
  const __m256d qm =
      _mm256_fmadd_pd(a, _mm256_set1_pd(0.63661977236758134), magic);
  const __m256d q = _mm256_sub_pd(qm, magic);
  const __m256i qi = _mm256_castpd_si256(qm);
  __m256d r = _mm256_fnmadd_pd(q, _mm256_set1_pd(1.5707963267948966), a);
  r = _mm256_fnmadd_pd(q, _mm256_set1_pd(6.123233995736766e-17), r);
  const __m256d r2 = _mm256_mul_pd(r, r);
  // 1/(2k+1)! and 1/(2k)! with alternating signs.
  __m256d ps = _mm256_set1_pd(-2.505210838544172e-08);
  ps = _mm256_fmadd_pd(ps, r2, _mm256_set1_pd(2.755731922398589e-06));
  ps = _mm256_fmadd_pd(ps, r2, _mm256_set1_pd(-1.984126984126984e-04));
  ps = _mm256_fmadd_pd(ps, r2, _mm256_set1_pd(8.333333333333333e-03));
  ps = _mm256_fmadd_pd(ps, r2, _mm256_set1_pd(-1.666666666666667e-01));
  ps = _mm256_fmadd_pd(_mm256_mul_pd(ps, r2), r, r);
  __m256d pc = _mm256_set1_pd(2.08767569878681e-09);
  pc = _mm256_fmadd_pd(pc, r2, _mm256_set1_pd(-2.755731922398589e-07));
  pc = _mm256_fmadd_pd(pc, r2, _mm256_set1_pd(2.48015873015873e-05));
  pc = _mm256_fmadd_pd(pc, r2, _mm256_set1_pd(-1.388888888888889e-03));
  pc = _mm256_fmadd_pd(pc, r2, _mm256_set1_pd(4.166666666666667e-02));
  pc = _mm256_fmadd_pd(pc, r2, _mm256_set1_pd(-0.5));
  pc = _mm256_fmadd_pd(pc, r2, _mm256_set1_pd(1.0));
  // Quadrant q: sin a = (q odd ? cos r : sin r), negated when q & 2;
  // cos a = (q odd ? sin r : cos r), negated when (q + 1) & 2.
  const __m256i one = _mm256_set1_epi64x(1);
  const __m256i two = _mm256_set1_epi64x(2);
  const __m256d swap = _mm256_castsi256_pd(
      _mm256_cmpeq_epi64(_mm256_and_si256(qi, one), one));
  const __m256d sin_sign = _mm256_castsi256_pd(
      _mm256_slli_epi64(_mm256_and_si256(qi, two), 62));
  const __m256d cos_sign = _mm256_castsi256_pd(_mm256_slli_epi64(
      _mm256_and_si256(_mm256_add_epi64(qi, one), two), 62));
  *s = _mm256_xor_pd(_mm256_blendv_pd(ps, pc, swap), sin_sign);
  *c = _mm256_xor_pd(_mm256_blendv_pd(pc, ps, swap), cos_sign);
}

struct Isa {
  static constexpr int kLanes = 8;
  using V = __m256;
  static V Load(const float* p) { return _mm256_loadu_ps(p); }
  static V Set1(float x) { return _mm256_set1_ps(x); }
  static V Mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static void SinCos(V a, V* s, V* c) {
    const V magnitude = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a);
    // All lanes in range (false for NaN, so those take SLEEF's path too).
    if (_mm256_movemask_ps(_mm256_cmp_ps(
            magnitude, _mm256_set1_ps(kDoublePathLimit), _CMP_LT_OQ)) ==
        0xff) {
      __m256d s_lo, c_lo, s_hi, c_hi;
      SinCosDouble(_mm256_cvtps_pd(_mm256_castps256_ps128(a)), &s_lo, &c_lo);
      SinCosDouble(_mm256_cvtps_pd(_mm256_extractf128_ps(a, 1)), &s_hi, &c_hi);
      *s = _mm256_set_m128(_mm256_cvtpd_ps(s_hi), _mm256_cvtpd_ps(s_lo));
      *c = _mm256_set_m128(_mm256_cvtpd_ps(c_hi), _mm256_cvtpd_ps(c_lo));
      return;
    }
    const Sleef___m256_2 r = Sleef_sincosf8_u10avx2(a);
    *s = r.x;
    *c = r.y;
  }
  static void Interleave(V a, V b, V* lo, V* hi) {
    // unpack works within 128-bit lanes; the permutes put the halves back
    // in order.
    const V l = _mm256_unpacklo_ps(a, b);  // a0 b0 a1 b1 | a4 b4 a5 b5
    const V h = _mm256_unpackhi_ps(a, b);  // a2 b2 a3 b3 | a6 b6 a7 b7
    *lo = _mm256_permute2f128_ps(l, h, 0x20);
    *hi = _mm256_permute2f128_ps(l, h, 0x31);
  }
  static void StoreF32(V v, uint8_t* dst) {
    _mm256_storeu_ps(reinterpret_cast<float*>(dst), v);
  }
  static void StoreF16(V v, uint8_t* dst) {
    _mm_storeu_si128(
        reinterpret_cast<__m128i*>(dst),
        _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static void StoreBF16(V v, uint8_t* dst) {
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i odd =
        _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7fff)),
                         odd),
        16);
    // packus works per 128-bit lane: 64-bit lanes 0 and 2 hold the results.
    const __m256i packed =
        _mm256_permute4x64_epi64(_mm256_packus_epi32(rounded, rounded), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst),
                     _mm256_castsi256_si128(packed));
  }
  static void StoreF64(V v, uint8_t* dst) {
    double* d = reinterpret_cast<double*>(dst);
    _mm256_storeu_pd(d, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
    _mm256_storeu_pd(d + 4, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
  }
};

}  // namespace

void ComputeFloat32Rows(const Float32RowJob& job, const float* timesteps,
                        int64_t rows, uint8_t* out) {
  RowsForIsa<Isa>(job, timesteps, rows, out);
}

}  // namespace cpu_avx2
}  // namespace temb
