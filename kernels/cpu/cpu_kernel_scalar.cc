// The scalar engine: one element at a time with SLEEF's scalar 1-ulp sincosf
// (the non-FMA algorithm of the SSE2 engine, reducing each argument on its
// own).  It runs on any CPU and is the simple reference the vector engines
// are tested against.
#include <sleef.h>

#include "cpu_kernel_impl.h"

namespace temb {
namespace cpu_scalar {
namespace {

struct Isa {
  static constexpr int kLanes = 1;
  using V = float;
  static V Load(const float* p) { return *p; }
  static V Set1(float x) { return x; }
  static V Mul(V a, V b) { return a * b; }
  static void SinCos(V a, V* s, V* c) {
    const Sleef_float2 r = Sleef_sincosf_u10(a);
    *s = r.x;
    *c = r.y;
  }
  static void Interleave(V a, V b, V* lo, V* hi) {
    *lo = a;
    *hi = b;
  }
  static void StoreF32(V v, uint8_t* dst) { std::memcpy(dst, &v, 4); }
  static void StoreF16(V v, uint8_t* dst) {
    const uint16_t h = FloatToHalf(v);
    std::memcpy(dst, &h, 2);
  }
  static void StoreBF16(V v, uint8_t* dst) {
    const uint16_t h = FloatToBFloat16(v);
    std::memcpy(dst, &h, 2);
  }
  static void StoreF64(V v, uint8_t* dst) {
    const double d = v;
    std::memcpy(dst, &d, 8);
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

}  // namespace cpu_scalar
}  // namespace temb
