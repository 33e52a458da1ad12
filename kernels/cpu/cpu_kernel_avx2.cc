// The AVX2 engine (compiled with -mavx2 -mfma -mf16c): 8 lanes, sin/cos in
// double below 2^20 rad (sincos_via_double.h) and SLEEF's AVX2 (FMA) sincosf
// beyond, F16C conversions for fp16.
#include <immintrin.h>
#include <sleef.h>

#include "cpu_kernel_impl.h"
#include "sincos_via_double.h"

namespace temb {
namespace cpu_avx2 {
namespace {

struct Isa {
  static constexpr int kLanes = 8;
  using V = __m256;
  static V Load(const float* p) { return _mm256_loadu_ps(p); }
  static V Set1(float x) { return _mm256_set1_ps(x); }
  static V Mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static void SinCos(V a, V* s, V* c) { SinCosViaDouble<Isa>(a, s, c); }

  // The interface of sincos_via_double.h.
  using D = __m256d;
  using I = __m256i;
  static D WidenLow(V a) { return _mm256_cvtps_pd(_mm256_castps256_ps128(a)); }
  static D WidenHigh(V a) {
    return _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1));
  }
  static V Narrow(D low, D high) {
    return _mm256_set_m128(_mm256_cvtpd_ps(high), _mm256_cvtpd_ps(low));
  }
  static D DSet1(double x) { return _mm256_set1_pd(x); }
  static D DMul(D a, D b) { return _mm256_mul_pd(a, b); }
  static D DFma(D a, D b, D c) { return _mm256_fmadd_pd(a, b, c); }
  static D DFnma(D a, D b, D c) { return _mm256_fnmadd_pd(a, b, c); }
  static D DSub(D a, D b) { return _mm256_sub_pd(a, b); }
  static bool AllBelow(V a, float limit) {
    const V magnitude = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a);
    return _mm256_movemask_ps(_mm256_cmp_ps(magnitude, _mm256_set1_ps(limit),
                                            _CMP_LT_OQ)) == 0xff;
  }
  static I QuadrantBits(D low, D high) {
    // The low halves of the 64-bit lanes, as l0 l1 h0 h1 | l2 l3 h2 h3;
    // then the 64-bit pairs put in order.
    const __m256 pairs = _mm256_shuffle_ps(
        _mm256_castpd_ps(low), _mm256_castpd_ps(high), _MM_SHUFFLE(2, 0, 2, 0));
    return _mm256_permute4x64_epi64(_mm256_castps_si256(pairs),
                                    _MM_SHUFFLE(3, 1, 2, 0));
  }
  static V SelectOdd(I q, V odd, V even) {
    // blendv picks by each lane's sign bit: move bit 0 there.
    return _mm256_blendv_ps(even, odd,
                            _mm256_castsi256_ps(_mm256_slli_epi32(q, 31)));
  }
  static V NegateWhereBit1(I q, V v) {
    const I sign =
        _mm256_slli_epi32(_mm256_and_si256(q, _mm256_set1_epi32(2)), 30);
    return _mm256_xor_ps(v, _mm256_castsi256_ps(sign));
  }
  static I AddOne(I q) { return _mm256_add_epi32(q, _mm256_set1_epi32(1)); }
  static void SleefSinCos(V a, V* s, V* c) {
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

void SinCos(const float* angles, int64_t n, float* sin_out, float* cos_out) {
  SinCosForIsa<Isa>(angles, n, sin_out, cos_out);
}

}  // namespace cpu_avx2
}  // namespace temb
