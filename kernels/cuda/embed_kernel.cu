// The fused embedding kernel: one launch writes every column of every row.
//
// Thread mapping: threadIdx.x/blockIdx.x pick a group of kVec consecutive
// frequencies (or, for repeat_only, kVec consecutive columns) and
// threadIdx.y/blockIdx.y stride over rows.  A thread loads its frequencies
// once and reuses them for every row it visits.  Tiny dims pack several rows
// into one block so warps stay full.
//
// Numerics (see frequencies.h and embedding_spec.h):
//   * fp32 math: a = fl(fl(fl(t * time_factor) * f) * scale), then sincosf.
//     The products use __fmul_rn so that no FMA contraction can change the
//     order PyTorch (and the CPU backend) use; multiplying by an exact 1.0f
//     changes nothing, so the factors are applied unconditionally.
//   * fp64 math: the same in double with sincos, rounded once to the output.
//   * sincosf/sincos are the accurate full-range versions; this file must
//     never be built with -use_fast_math.
//   * fp16/bf16 outputs round to nearest even with a single rounding, also
//     from double (cvt.rn.{f16,bf16}.f64, or CUDA's round-to-odd emulation).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "temb/kernels/embed_kernel.cuh"

namespace temb {
namespace cuda {
namespace {

constexpr int kThreadsPerBlock = 256;
constexpr int64_t kMaxGridY = 65535;
constexpr int kMaxStoreBytes = 16;  // widest global store on sm_80..sm_90

// Output formats: the storage type and the single rounding into it.
struct Fp32Out {
  using Storage = float;
  static constexpr bool kPairs = false;
  static __device__ float From(float v) { return v; }
  static __device__ float From(double v) { return __double2float_rn(v); }
};
struct Fp64Out {
  using Storage = double;
  static constexpr bool kPairs = false;
  static __device__ double From(float v) { return static_cast<double>(v); }
  static __device__ double From(double v) { return v; }
};
struct Fp16Out {
  using Storage = uint16_t;
  static constexpr bool kPairs = true;
  // Two results in one instruction: (hi << 16) | lo, each rounded exactly as
  // From(float) rounds it.
  static __device__ uint32_t FromPair(float lo, float hi) {
#if __CUDA_ARCH__ >= 800
    uint32_t pair;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(pair) : "f"(hi), "f"(lo));
    return pair;
#else
    return (uint32_t{From(hi)} << 16) | From(lo);
#endif
  }
  static __device__ uint16_t From(float v) {
    return __half_as_ushort(__float2half_rn(v));
  }
  static __device__ uint16_t From(double v) {
    return __half_as_ushort(__double2half(v));
  }
};
struct Bf16Out {
  using Storage = uint16_t;
  static constexpr bool kPairs = true;
  static __device__ uint32_t FromPair(float lo, float hi) {
#if __CUDA_ARCH__ >= 800
    uint32_t pair;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(pair) : "f"(hi), "f"(lo));
    return pair;
#else
    return (uint32_t{From(hi)} << 16) | From(lo);
#endif
  }
  static __device__ uint16_t From(float v) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
  }
  static __device__ uint16_t From(double v) {
    return __bfloat16_as_ushort(__double2bfloat16(v));
  }
};

// N elements stored with one aligned (vector) instruction.
template <typename T, int N>
struct alignas(sizeof(T) * N) Packet {
  T v[N];
};

template <typename T, int N>
__device__ __forceinline__ void StorePacket(T* dst, const Packet<T, N>& p) {
  *reinterpret_cast<Packet<T, N>*>(dst) = p;
}

// Rounds N consecutive results into the output format and stores them with
// one aligned instruction.  16-bit formats of float results round two at a
// time: the conversions, not the memory, bound the fp16/bf16 kernels (both
// ran at 2.7 TB/s on an H100 and on an H200, whose memsets differ by 1.4x),
// and one paired conversion costs what a single one does.
template <typename Out, typename Real, int N>
__device__ __forceinline__ void StoreRounded(typename Out::Storage* dst,
                                             const Real (&values)[N]) {
  if constexpr (Out::kPairs && sizeof(Real) == sizeof(float) && N % 2 == 0) {
    Packet<uint32_t, N / 2> pairs;
#pragma unroll
    for (int k = 0; k < N / 2; ++k) {
      pairs.v[k] = Out::FromPair(values[2 * k], values[2 * k + 1]);
    }
    StorePacket(reinterpret_cast<uint32_t*>(dst), pairs);
  } else {
    Packet<typename Out::Storage, N> packet;
#pragma unroll
    for (int k = 0; k < N; ++k) packet.v[k] = Out::From(values[k]);
    StorePacket(dst, packet);
  }
}

__device__ __forceinline__ float Mul(float a, float b) {
  return __fmul_rn(a, b);
}
__device__ __forceinline__ double Mul(double a, double b) {
  return __dmul_rn(a, b);
}
__device__ __forceinline__ void SinCos(float a, float* s, float* c) {
  sincosf(a, s, c);
}
__device__ __forceinline__ void SinCos(double a, double* s, double* c) {
  sincos(a, s, c);
}

__device__ __forceinline__ int64_t FirstRow() {
  return static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y;
}
__device__ __forceinline__ int64_t RowStride() {
  return static_cast<int64_t>(gridDim.y) * blockDim.y;
}

// Each thread owns frequencies [g * kVec, (g + 1) * kVec).  For an odd dim
// (halves layout, kVec == 1) one extra thread per row, g == dim / 2, writes
// the zero in the last column.
template <typename Out, typename Real, int kVec, bool kInterleaved>
__global__ void __launch_bounds__(kThreadsPerBlock)
    SinusoidKernel(const EmbedArgs args) {
  using Storage = typename Out::Storage;
  const int half = args.dim / 2;
  const int groups = half / kVec;
  const int g = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  const bool pad = !kInterleaved && g == groups && (args.dim & 1) != 0;
  if (g >= groups && !pad) return;

  Real freq[kVec];
  if (!pad) {
    const Real* frequencies = static_cast<const Real*>(args.frequencies);
#pragma unroll
    for (int k = 0; k < kVec; ++k) freq[k] = frequencies[g * kVec + k];
  }
  const Real time_factor = static_cast<Real>(args.time_factor);
  const Real scale = static_cast<Real>(args.scale);
  Storage* const out = static_cast<Storage*>(args.out);

  for (int64_t row = FirstRow(); row < args.rows; row += RowStride()) {
    Storage* const out_row = out + row * args.dim;
    if (pad) {
      out_row[args.dim - 1] = Storage(0);
      continue;
    }
    const Real t = Mul(static_cast<Real>(args.timesteps[row]), time_factor);
    Real first[kVec];
    Real second[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const Real angle = Mul(Mul(t, freq[k]), scale);
      Real s;
      Real c;
      SinCos(angle, &s, &c);
      first[k] = args.flip_sin_to_cos ? c : s;
      second[k] = args.flip_sin_to_cos ? s : c;
    }
    if constexpr (kInterleaved) {
      Real pairs[2 * kVec];
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        pairs[2 * k] = first[k];
        pairs[2 * k + 1] = second[k];
      }
      StoreRounded<Out>(out_row + 2 * g * kVec, pairs);
    } else {
      StoreRounded<Out>(out_row + g * kVec, first);
      StoreRounded<Out>(out_row + half + g * kVec, second);
    }
  }
}

// repeat_only: every column of row n is timesteps[n] in the output type.
template <typename Out, int kVec>
__global__ void __launch_bounds__(kThreadsPerBlock)
    RepeatKernel(const EmbedArgs args) {
  using Storage = typename Out::Storage;
  const int g = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (g >= args.dim / kVec) return;
  Storage* const out = static_cast<Storage*>(args.out);
  for (int64_t row = FirstRow(); row < args.rows; row += RowStride()) {
    const Storage value = Out::From(args.timesteps[row]);
    Packet<Storage, kVec> packet;
#pragma unroll
    for (int k = 0; k < kVec; ++k) packet.v[k] = value;
    StorePacket(out + row * args.dim + g * kVec, packet);
  }
}

__global__ void ProbeKernel(int* out, int seed) {
  const int i = static_cast<int>(threadIdx.x);
  if (i < kProbeValues) out[i] = ProbeValue(seed, i);
}

// Launches `kernel` with `items_per_row` threads across and rows down.
template <typename... Params>
cudaError_t LaunchRows(void (*kernel)(Params...), const EmbedArgs& args,
                       int items_per_row, cudaStream_t stream) {
  int block_x = 1;
  while (block_x < items_per_row && block_x < kThreadsPerBlock) block_x *= 2;
  const int block_y = kThreadsPerBlock / block_x;
  const int64_t grid_x = (items_per_row + block_x - 1) / block_x;
  const int64_t row_blocks = (args.rows + block_y - 1) / block_y;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(
      static_cast<unsigned>(grid_x),
      static_cast<unsigned>(row_blocks < kMaxGridY ? row_blocks : kMaxGridY));
  config.blockDim =
      dim3(static_cast<unsigned>(block_x), static_cast<unsigned>(block_y));
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  return cudaLaunchKernelEx(&config, kernel, args);
}

// True when every packet of `vec` frequencies (`packet_bytes` wide) starts at
// an aligned address in every row: the row length, the offset of the second
// half and the base pointer must all be multiples of the packet.
bool PacketsAligned(const EmbedArgs& args, int vec, int packet_bytes) {
  return args.dim % vec == 0 && (args.dim / 2) % vec == 0 &&
         reinterpret_cast<uintptr_t>(args.out) % packet_bytes == 0;
}

template <typename Out, typename Real, bool kInterleaved>
cudaError_t LaunchSinusoid(const EmbedArgs& args, cudaStream_t stream) {
  using Storage = typename Out::Storage;
  // Frequencies one thread handles with one store (two for halves).
  constexpr int kPerFrequency = kInterleaved ? 2 : 1;
  constexpr int kFit =
      kMaxStoreBytes / static_cast<int>(sizeof(Storage) * kPerFrequency);
  // Up to 8 frequencies a thread: 16-byte stores for fp16/bf16 too.  At four
  // (8-byte stores) a 1 GiB bf16 output reached 0.77x of cudaMemset on an
  // H100, at eight 0.84x (bench/report_notes.md).
  constexpr int kMaxVec = kFit < 8 ? kFit : 8;
  const int half = args.dim / 2;
  if constexpr (kMaxVec >= 8) {
    if (PacketsAligned(args, 8, 8 * kPerFrequency * sizeof(Storage))) {
      return LaunchRows(SinusoidKernel<Out, Real, 8, kInterleaved>, args,
                        half / 8, stream);
    }
  }
  if constexpr (kMaxVec >= 4) {
    if (PacketsAligned(args, 4, 4 * kPerFrequency * sizeof(Storage))) {
      return LaunchRows(SinusoidKernel<Out, Real, 4, kInterleaved>, args,
                        half / 4, stream);
    }
  }
  if constexpr (kMaxVec >= 2) {
    if (PacketsAligned(args, 2, 2 * kPerFrequency * sizeof(Storage))) {
      return LaunchRows(SinusoidKernel<Out, Real, 2, kInterleaved>, args,
                        half / 2, stream);
    }
  }
  const int pad = kInterleaved ? 0 : (args.dim & 1);
  return LaunchRows(SinusoidKernel<Out, Real, 1, kInterleaved>, args,
                    half + pad, stream);
}

template <typename Out>
cudaError_t LaunchRepeat(const EmbedArgs& args, cudaStream_t stream) {
  using Storage = typename Out::Storage;
  constexpr int kFit = kMaxStoreBytes / static_cast<int>(sizeof(Storage));
  constexpr int kMaxVec = kFit < 4 ? kFit : 4;
  const auto aligned = [&](int vec) {
    return args.dim % vec == 0 &&
           reinterpret_cast<uintptr_t>(args.out) % (vec * sizeof(Storage)) == 0;
  };
  if constexpr (kMaxVec >= 4) {
    if (aligned(4))
      return LaunchRows(RepeatKernel<Out, 4>, args, args.dim / 4, stream);
  }
  if (aligned(2))
    return LaunchRows(RepeatKernel<Out, 2>, args, args.dim / 2, stream);
  return LaunchRows(RepeatKernel<Out, 1>, args, args.dim, stream);
}

template <typename Out>
cudaError_t LaunchFor(const EmbedArgs& args, cudaStream_t stream) {
  if (args.repeat_only) return LaunchRepeat<Out>(args, stream);
  if (args.fp64_math) {
    return args.interleaved ? LaunchSinusoid<Out, double, true>(args, stream)
                            : LaunchSinusoid<Out, double, false>(args, stream);
  }
  return args.interleaved ? LaunchSinusoid<Out, float, true>(args, stream)
                          : LaunchSinusoid<Out, float, false>(args, stream);
}

}  // namespace

cudaError_t LaunchEmbed(const EmbedArgs& args, cudaStream_t stream) {
  if (args.rows <= 0 || args.dim <= 0) return cudaSuccess;
  switch (args.out_type) {
    case OutType::kFloat32:
      return LaunchFor<Fp32Out>(args, stream);
    case OutType::kFloat16:
      return LaunchFor<Fp16Out>(args, stream);
    case OutType::kBFloat16:
      return LaunchFor<Bf16Out>(args, stream);
    case OutType::kFloat64:
      return LaunchFor<Fp64Out>(args, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchProbe(int* out, int seed, cudaStream_t stream) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(1);
  config.blockDim = dim3(kProbeValues);
  config.stream = stream;
  return cudaLaunchKernelEx(&config, ProbeKernel, out, seed);
}

}  // namespace cuda
}  // namespace temb
