// sin and cos of float32 angles evaluated in double precision, written once
// against a small vector interface and used by the AVX2 and AVX-512 engines.
//
// Why not SLEEF's 1-ulp sincosf alone: it keeps its cheap Cody-Waite
// reduction only while every lane of a vector is below 125 rad and runs a
// Payne-Hanek reduction otherwise, about 2.6x the cost.  At t ~ 1000 every
// column with f > 0.125 exceeds 125 rad, so the kernel spent most of its
// time there.  Widening to double removes the problem at every magnitude
// up to kDoublePathLimit and is more accurate as well:
//
//  1. Reduction: q = nearest integer to a * 2/pi, r = (a - q * C1) - q * C2
//  with
//     C1 = fl64(pi/2), C2 = fl64(pi/2 - C1), both as fused multiply-adds.
//     a - q * C1 is exact: a float32 angle above pi/4 is a multiple of
//     2^-24, q * C1 a multiple of 2^-52, and the difference is below 1, so
//     it fits the 53-bit significand.  The second step rounds once
//     (2^-53 relative) and C1 + C2 misses pi/2 by under 1e-32, i.e. |q| *
//     1e-32 absolute: below 1e-26 for |a| < 2^20, far under the smallest
//     |r| any float32 angle in that range leaves (its distance to the
//     nearest multiple of pi/2; the dense tests cover every such angle).
//  2. Polynomials on |r| <= pi/4, sin to r^9 and cos to r^10, fitted for
//     relative error: below 2^-37 and 2^-42 of the result.
//  3. The quadrant q mod 4 picks and negates (exact), then one rounding to
//     float32.
//
// So each result is the correctly rounded float32 value except where the
// exact one lies within ~2^-36 relative of a halfway point, and never more
// than 0.5 + 2^-12 ulp away.  tests/kernels/sincos_accuracy_test.cc checks
// that bound against float64 sin/cos over the whole range below the limit.
//
// The Isa struct provides, besides the row-engine interface
// (cpu_kernel_impl.h):
//   D                          double vector of kLanes / 2
//   WidenLow(V), WidenHigh(V) -> D    the two halves, exactly
//   Narrow(D low, D high) -> V        round to float32, nearest even
//   DSet1(double), DMul(D, D), DFma(a, b, c) = a * b + c (fused),
//   DFnma(a, b, c) = c - a * b (fused), DSub(D, D)
//   AllBelow(V, float limit)   every lane has |a| < limit (false for NaN)
//   I, QuadrantBits(D low, D high) -> I
//                              the low 32 bits of each 64-bit lane: low's
//                              lanes then high's, in Narrow(low, high)'s order
//   SelectOdd(I q, V odd, V even)   per lane: q odd ? odd : even
//   NegateWhereBit1(I q, V v)  -v in lanes where q & 2
//   AddOne(I q)
//   SleefSinCos(V, V*, V*)     the full-range fallback
#ifndef TEMB_KERNELS_CPU_SINCOS_VIA_DOUBLE_H_
#define TEMB_KERNELS_CPU_SINCOS_VIA_DOUBLE_H_

namespace temb {
namespace {  // NOLINT(build/namespaces): compiled per ISA, like the engine.

// |a| below this takes the double path; larger angles (and NaN, which a
// validated request never produces) go to SLEEF's full-range reduction.
// Diffusion angles stay below 1e5.
constexpr float kDoublePathLimit = 1048576.0f;  // 2^20

template <typename Isa>
inline void SinCosHalf(typename Isa::D a, typename Isa::D* sin_r,
                       typename Isa::D* cos_r, typename Isa::D* shifted_q) {
  using D = typename Isa::D;
  // Adding 1.5 * 2^52 rounds a * 2/pi to an integer q (ties to even), held
  // in the low bits of the sum's significand: its low 32 bits are q as a
  // two's complement int32 (|q| < 2^51 keeps the exponent), which is how the
  // caller reads the quadrant without a conversion.  Subtracting it again
  // leaves q exactly, and +0 for a = -0, so that r = a - q * C1 keeps the
  // sign of a zero angle (sin -0 = -0).
  const D magic = Isa::DSet1(6755399441055744.0);
  const D shifted = Isa::DFma(a, Isa::DSet1(0.63661977236758134), magic);
  const D quadrant_q = Isa::DSub(shifted, magic);
  D r = Isa::DFnma(quadrant_q, Isa::DSet1(1.5707963267948966), a);
  r = Isa::DFnma(quadrant_q, Isa::DSet1(6.123233995736766e-17), r);
  const D r2 = Isa::DMul(r, r);
  const D r4 = Isa::DMul(r2, r2);
  // sin r = r * (1 + r2 * P(r2)), cos r = 1 - r2/2 + r4 * Q(r2), P and Q of
  // degree 3 fitted for relative error (scripts/fit_sincos_polynomials.py),
  // each evaluated as (c0 + c1 r2) + r4 (c2 + c3 r2): two short chains
  // rather than one long Horner chain.  The product form of sin keeps the
  // sign of r = -0.
  const D p = Isa::DFma(r4,
                        Isa::DFma(Isa::DSet1(2.718008043772896e-06), r2,
                                  Isa::DSet1(-0.0001983929780887016)),
                        Isa::DFma(Isa::DSet1(0.008333329247460122), r2,
                                  Isa::DSet1(-0.1666666664010849)));
  const D q = Isa::DFma(r4,
                        Isa::DFma(Isa::DSet1(-2.7203717573122815e-07), r2,
                                  Isa::DSet1(2.479943156715139e-05)),
                        Isa::DFma(Isa::DSet1(-0.0013888883370927023), r2,
                                  Isa::DSet1(0.04166666661763299)));
  *sin_r = Isa::DMul(r, Isa::DFma(r2, p, Isa::DSet1(1.0)));
  *cos_r = Isa::DFma(r4, q, Isa::DFma(r2, Isa::DSet1(-0.5), Isa::DSet1(1.0)));
  *shifted_q = shifted;
}

template <typename Isa>
inline void SinCosViaDouble(typename Isa::V a, typename Isa::V* sin_a,
                            typename Isa::V* cos_a) {
  using D = typename Isa::D;
  using V = typename Isa::V;
  if (!Isa::AllBelow(a, kDoublePathLimit)) {
    Isa::SleefSinCos(a, sin_a, cos_a);
    return;
  }
  D s_low, c_low, shifted_low, s_high, c_high, shifted_high;
  SinCosHalf<Isa>(Isa::WidenLow(a), &s_low, &c_low, &shifted_low);
  SinCosHalf<Isa>(Isa::WidenHigh(a), &s_high, &c_high, &shifted_high);
  const V s = Isa::Narrow(s_low, s_high);
  const V c = Isa::Narrow(c_low, c_high);
  const auto q = Isa::QuadrantBits(shifted_low, shifted_high);
  // a = q * pi/2 + r:  sin a = (q odd ? cos r : sin r), negated when q & 2;
  //                    cos a = (q odd ? sin r : cos r), negated when
  //                    (q + 1) & 2.
  *sin_a = Isa::NegateWhereBit1(q, Isa::SelectOdd(q, c, s));
  *cos_a = Isa::NegateWhereBit1(Isa::AddOne(q), Isa::SelectOdd(q, s, c));
}

}  // namespace
}  // namespace temb

#endif  // TEMB_KERNELS_CPU_SINCOS_VIA_DOUBLE_H_
