// The AVX2 engine (compiled with -mavx2 -mfma -mf16c): 8 lanes, SLEEF's
// AVX2 (FMA) sincosf, F16C conversions for fp16.
#include <immintrin.h>
#include <sleef.h>

#include "cpu_kernel_impl.h"

namespace temb {
namespace cpu_avx2 {
namespace {

struct Isa {
  static constexpr int kLanes = 8;
  using V = __m256;
  static V Load(const float* p) { return _mm256_loadu_ps(p); }
  static V Set1(float x) { return _mm256_set1_ps(x); }
  static V Mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static void SinCos(V a, V* s, V* c) {
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
