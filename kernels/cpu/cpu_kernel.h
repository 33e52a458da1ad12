// The contract between the CPU backend and its row engines.
//
// An engine computes float32-precision rows (PyTorch's float32 op order) for
// one instruction set.  The same source (cpu_kernel_impl.h) is compiled once
// per instruction set, each copy in its own namespace and translation unit
// with its own -m flags; the backend picks one copy at run time, so the
// binary runs on any x86-64 and uses wider vectors where the CPU has them.
//
// Every engine evaluates, per element, exactly:
//   a = fl32(t_scaled * f_i), then fl32(scale * a) when apply_scale,
//   (sin a, cos a) within 1 ulp: the AVX2 and AVX-512 engines in double
//   below 2^20 rad (sincos_via_double.h: correctly rounded but for rare
//   near-halfway cases, identical on both), SLEEF's 1-ulp sincosf elsewhere,
// and rounds to the output dtype to nearest, ties to even.  Engines may still
// differ by 1 ulp of float32 in a small fraction of elements: SLEEF's u10 is
// not correctly rounded in about 4% of angles, and its vector sincosf picks
// its argument reduction per vector (the precise one as soon as one lane is
// large).
#ifndef TEMB_KERNELS_CPU_CPU_KERNEL_H_
#define TEMB_KERNELS_CPU_CPU_KERNEL_H_

#include <cstdint>

#include "temb/kernels/embedding_spec.h"

namespace temb {

// The widest vector any engine loads: frequency tables are padded with zeros
// to a multiple of this, so engines never read past the end.
inline constexpr int kMaxLanes = 16;

// One float32-precision request, resolved from an EmbeddingSpec.
struct Float32RowJob {
  const float* freqs = nullptr;  // half_dim values, zero-padded to kMaxLanes
  int dim = 0;
  int half_dim = 0;
  float time_factor = 1.0f;
  bool apply_time_factor = false;  // time_factor != 1
  float scale = 1.0f;
  bool apply_scale = false;  // scale != 1
  bool flip_sin_to_cos = true;
  Layout layout = Layout::kHalves;
  DType dtype = DType::kFloat32;
};

// Writes rows [0, rows) of the embedding of `timesteps` to `out` (rows of
// job.dim elements of job.dtype, `row_bytes` apart), including the zero
// column of an odd dim.  Requires a spec that passed ValidateRequest and is
// neither repeat_only nor fp64 precision.
using Float32RowsFn = void (*)(const Float32RowJob& job, const float* timesteps,
                               int64_t rows, uint8_t* out);

// sin and cos of `n` float32 angles, exactly as the engine's rows evaluate
// them.
using SinCosFn = void (*)(const float* angles, int64_t n, float* sin_out,
                          float* cos_out);

namespace cpu_scalar {
void ComputeFloat32Rows(const Float32RowJob& job, const float* timesteps,
                        int64_t rows, uint8_t* out);
void SinCos(const float* angles, int64_t n, float* sin_out, float* cos_out);
}  // namespace cpu_scalar

#if defined(__x86_64__)
namespace cpu_sse2 {
void ComputeFloat32Rows(const Float32RowJob& job, const float* timesteps,
                        int64_t rows, uint8_t* out);
void SinCos(const float* angles, int64_t n, float* sin_out, float* cos_out);
}  // namespace cpu_sse2

namespace cpu_avx2 {  // requires AVX2, FMA and F16C
void ComputeFloat32Rows(const Float32RowJob& job, const float* timesteps,
                        int64_t rows, uint8_t* out);
void SinCos(const float* angles, int64_t n, float* sin_out, float* cos_out);
}  // namespace cpu_avx2

namespace cpu_avx512 {  // requires AVX-512F
void ComputeFloat32Rows(const Float32RowJob& job, const float* timesteps,
                        int64_t rows, uint8_t* out);
void SinCos(const float* angles, int64_t n, float* sin_out, float* cos_out);
}  // namespace cpu_avx512
#endif  // defined(__x86_64__)

}  // namespace temb

#endif  // TEMB_KERNELS_CPU_CPU_KERNEL_H_
