// Launchers for the CUDA embedding kernels.
//
// Plain pointers, sizes and a stream in, a cudaError_t out: no allocation, no
// synchronisation, no Status.  The backend (cuda_backend.cc) owns memory and
// turns errors into absl::Status.  This header is private to kernels/cuda and
// is plain C++, so host code compiled by the C++ compiler can include it.
#ifndef TEMB_KERNELS_EMBED_KERNEL_CUH_
#define TEMB_KERNELS_EMBED_KERNEL_CUH_

#include <cuda_runtime_api.h>

#include <cstdint>

#if defined(__CUDACC__)
#define TEMB_HOST_DEVICE __host__ __device__
#else
#define TEMB_HOST_DEVICE
#endif

namespace temb {
namespace cuda {

// Output element type (mirrors temb::DType without depending on it).
enum class OutType : uint8_t { kFloat32, kFloat16, kBFloat16, kFloat64 };

// One request.  All pointers are device pointers.
struct EmbedArgs {
  // [rows] float32 timesteps.
  const float* timesteps = nullptr;
  // [dim / 2] frequencies: float, or double when `fp64_math`.  Unused (may
  // be null) for repeat_only or dim == 1.
  const void* frequencies = nullptr;
  // [rows, dim] row-major elements of `out_type`, aligned to at least twice
  // the element size (interleaved pairs are stored together); 16-byte
  // alignment (cudaMalloc gives 256) enables the widest vector stores.
  void* out = nullptr;
  int64_t rows = 0;
  int dim = 0;
  // Applied as fl(fl(t * time_factor) * f) * scale, in the math precision.
  double time_factor = 1.0;
  double scale = 1.0;
  bool flip_sin_to_cos = true;
  bool interleaved = false;  // requires an even dim
  bool repeat_only = false;
  bool fp64_math = false;  // double angles and sincos, rounded once
  OutType out_type = OutType::kFloat32;
};

// Enqueues the single kernel that writes every element of `args.out`.
// Returns the launch error (kernel faults surface at the next
// synchronisation of `stream`).  rows == 0 launches nothing.
cudaError_t LaunchEmbed(const EmbedArgs& args, cudaStream_t stream);

// Enqueues a kernel that writes kProbeValues ints, out[i] = ProbeValue(seed,
// i), so a caller can check that kernels really run on the current device.
inline constexpr int kProbeValues = 64;
TEMB_HOST_DEVICE constexpr int ProbeValue(int seed, int i) {
  return seed * 31 + i * 7 + 1;
}
cudaError_t LaunchProbe(int* out, int seed, cudaStream_t stream);

}  // namespace cuda
}  // namespace temb

#endif  // TEMB_KERNELS_EMBED_KERNEL_CUH_
