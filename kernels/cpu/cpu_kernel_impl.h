// The row engine, written once against a small instruction-set interface and
// compiled once per instruction set (cpu_kernel_<isa>.cc).
//
// Each including translation unit first defines a struct `Isa` with:
//   kLanes                      floats per vector
//   V                           the vector type
//   Load(const float*), Set1(float), Mul(V, V)
//   SinCos(V, V* sin, V* cos)   within 1 ulp (SLEEF u10, or
//                               sincos_via_double.h)
//   Interleave(V a, V b, V* lo, V* hi)
//                               lo = a0 b0 a1 b1 ...; hi = the rest
//   StoreF32/StoreF16/StoreBF16/StoreF64(V, uint8_t*)
//                               kLanes elements, round to nearest even
// and then calls RowsForIsa<Isa>(...) and SinCosForIsa<Isa>(...).
//
// Everything here has internal linkage on purpose: the same inline code is
// compiled with different -m flags in each translation unit, and a shared
// (weak) symbol would let the linker hand AVX-512 code to the SSE2 engine.
// For the same reason this file uses no standard-library templates.
#ifndef TEMB_KERNELS_CPU_CPU_KERNEL_IMPL_H_
#define TEMB_KERNELS_CPU_CPU_KERNEL_IMPL_H_

#include <cstdint>
#include <cstring>

#include "cpu_kernel.h"
#include "temb/kernels/dtype.h"
#include "temb/kernels/embedding_spec.h"

namespace temb {
namespace {  // NOLINT(build/namespaces): see the file comment.

template <typename Isa, DType kDType>
struct Store;

template <typename Isa>
struct Store<Isa, DType::kFloat32> {
  static constexpr int kBytes = 4;
  static void Full(typename Isa::V v, uint8_t* dst) { Isa::StoreF32(v, dst); }
};
template <typename Isa>
struct Store<Isa, DType::kFloat16> {
  static constexpr int kBytes = 2;
  static void Full(typename Isa::V v, uint8_t* dst) { Isa::StoreF16(v, dst); }
};
template <typename Isa>
struct Store<Isa, DType::kBFloat16> {
  static constexpr int kBytes = 2;
  static void Full(typename Isa::V v, uint8_t* dst) { Isa::StoreBF16(v, dst); }
};
template <typename Isa>
struct Store<Isa, DType::kFloat64> {
  static constexpr int kBytes = 8;
  static void Full(typename Isa::V v, uint8_t* dst) { Isa::StoreF64(v, dst); }
};

// Stores the first `count` (<= kLanes) elements of `v`.  A partial vector
// (the tail of a half) goes through a buffer, converted by the same
// instructions as full ones, so nothing is written past it.
template <typename Isa, DType kDType>
inline void StorePartial(typename Isa::V v, int count, uint8_t* dst) {
  using S = Store<Isa, kDType>;
  if (count == Isa::kLanes) {
    S::Full(v, dst);
    return;
  }
  alignas(64) uint8_t buffer[Isa::kLanes * S::kBytes];
  S::Full(v, buffer);
  std::memcpy(dst, buffer, static_cast<size_t>(count) * S::kBytes);
}

// Stores the sin and cos of `count` (<= kLanes) frequencies from column i on
// of one row, in the layout and order the job asks for.
template <typename Isa, DType kDType, Layout kLayout>
inline void StoreColumns(typename Isa::V sin_a, typename Isa::V cos_a,
                         bool flip_sin_to_cos, int half, int i, int count,
                         uint8_t* row) {
  using V = typename Isa::V;
  constexpr int kW = Isa::kLanes;
  constexpr int kBytes = Store<Isa, kDType>::kBytes;
  const V first = flip_sin_to_cos ? cos_a : sin_a;
  const V second = flip_sin_to_cos ? sin_a : cos_a;
  if (kLayout == Layout::kHalves) {
    StorePartial<Isa, kDType>(first, count, row + i * kBytes);
    StorePartial<Isa, kDType>(second, count, row + (half + i) * kBytes);
  } else {
    V lo, hi;
    Isa::Interleave(first, second, &lo, &hi);
    uint8_t* pair = row + 2 * i * kBytes;
    const int pairs = 2 * count;
    StorePartial<Isa, kDType>(lo, pairs < kW ? pairs : kW, pair);
    if (pairs > kW) {
      StorePartial<Isa, kDType>(hi, pairs - kW, pair + kW * kBytes);
    }
  }
}

template <typename Isa, DType kDType, Layout kLayout>
void Rows(const Float32RowJob& job, const float* timesteps, int64_t rows,
          uint8_t* out) {
  using V = typename Isa::V;
  constexpr int kW = Isa::kLanes;
  constexpr int kBytes = Store<Isa, kDType>::kBytes;
  // The job's fields as locals: stores through `out` (bytes, which may
  // alias anything) would otherwise make the compiler reload them on every
  // vector.
  const int half = job.half_dim;
  const float* const freqs = job.freqs;
  const bool apply_time_factor = job.apply_time_factor;
  const float time_factor = job.time_factor;
  const bool apply_scale = job.apply_scale;
  const bool flip = job.flip_sin_to_cos;
  const bool odd_dim = job.dim & 1;
  const int64_t row_bytes = static_cast<int64_t>(job.dim) * kBytes;
  const V scale = Isa::Set1(job.scale);
  for (int64_t n = 0; n < rows; ++n) {
    uint8_t* row = out + n * row_bytes;
    const float t =
        apply_time_factor ? time_factor * timesteps[n] : timesteps[n];
    const V tv = Isa::Set1(t);
    const auto angles_at = [&](int i) {
      const V angle = Isa::Mul(tv, Isa::Load(freqs + i));
      return apply_scale ? Isa::Mul(scale, angle) : angle;
    };
    int i = 0;
    // Two vectors per step: their sin/cos dependency chains are independent
    // and the core overlaps them (5-10% faster on Zen 4 than one at a
    // time; four at a time spill registers and are slower).  Each vector is
    // computed exactly as it would be alone.
    for (; i + 2 * kW <= half; i += 2 * kW) {
      V s0, c0, s1, c1;
      Isa::SinCos(angles_at(i), &s0, &c0);
      Isa::SinCos(angles_at(i + kW), &s1, &c1);
      StoreColumns<Isa, kDType, kLayout>(s0, c0, flip, half, i, kW, row);
      StoreColumns<Isa, kDType, kLayout>(s1, c1, flip, half, i + kW, kW, row);
    }
    for (; i < half; i += kW) {
      V s, c;
      Isa::SinCos(angles_at(i), &s, &c);
      const int count = half - i < kW ? half - i : kW;
      StoreColumns<Isa, kDType, kLayout>(s, c, flip, half, i, count, row);
    }
    // Odd dim: the last column is +0 in every dtype (all bits clear).
    if (odd_dim) std::memset(row + (row_bytes - kBytes), 0, kBytes);
  }
}

template <typename Isa, DType kDType>
void RowsForDType(const Float32RowJob& job, const float* timesteps,
                  int64_t rows, uint8_t* out) {
  if (job.layout == Layout::kInterleaved) {
    Rows<Isa, kDType, Layout::kInterleaved>(job, timesteps, rows, out);
  } else {
    Rows<Isa, kDType, Layout::kHalves>(job, timesteps, rows, out);
  }
}

// sin and cos of n angles with the engine's SinCos, for the accuracy tests
// and the benchmarks; a partial last vector is read from a zero-filled copy.
template <typename Isa>
void SinCosForIsa(const float* angles, int64_t n, float* sin_out,
                  float* cos_out) {
  using V = typename Isa::V;
  constexpr int kW = Isa::kLanes;
  for (int64_t i = 0; i < n; i += kW) {
    const int count = n - i < kW ? static_cast<int>(n - i) : kW;
    V a;
    if (count == kW) {
      a = Isa::Load(angles + i);
    } else {
      alignas(64) float in[kW] = {};
      std::memcpy(in, angles + i, static_cast<size_t>(count) * 4);
      a = Isa::Load(in);
    }
    V s, c;
    Isa::SinCos(a, &s, &c);
    StorePartial<Isa, DType::kFloat32>(s, count,
                                       reinterpret_cast<uint8_t*>(sin_out + i));
    StorePartial<Isa, DType::kFloat32>(c, count,
                                       reinterpret_cast<uint8_t*>(cos_out + i));
  }
}

// Chooses the instantiation once per call so the inner loop has no branches
// on the dtype or the layout.
template <typename Isa>
void RowsForIsa(const Float32RowJob& job, const float* timesteps, int64_t rows,
                uint8_t* out) {
  switch (job.dtype) {
    case DType::kFloat32:
      return RowsForDType<Isa, DType::kFloat32>(job, timesteps, rows, out);
    case DType::kFloat16:
      return RowsForDType<Isa, DType::kFloat16>(job, timesteps, rows, out);
    case DType::kBFloat16:
      return RowsForDType<Isa, DType::kBFloat16>(job, timesteps, rows, out);
    case DType::kFloat64:
      return RowsForDType<Isa, DType::kFloat64>(job, timesteps, rows, out);
  }
}

}  // namespace
}  // namespace temb

#endif  // TEMB_KERNELS_CPU_CPU_KERNEL_IMPL_H_
