// A Linear layer (y = x W^T + b) on the CPU for the conditioning models:
// host spans in, host floats out, no checkpoint types.
//
// Batch invariance is the contract that matters here: the bits of output
// row m depend only on row m of the input and on the parameters, never on
// how many other rows are computed in the same call, on the thread count or
// on the engine.  Every output element is one dot product summed by one
// thread in a fixed order, so a cache can hold rows computed one at a time
// and hand them out next to rows computed in a batch of hundreds:
//  - bf16 weights: 16 float32 lanes over blocks of 32 k (zero-padded); in
//    each block lane j adds x*w for element 2j+1 then for 2j, each a fused
//    multiply-add rounded once, denormal inputs read as zero and tiny
//    results flushed to zero (VDPBF16PS's definition, which the engines
//    without it reproduce); then a fixed pairwise tree over the lanes.
//  - fp32 (and fp16, widened) weights: 16 float32 lanes of products and
//    sums rounded separately over k, k += 16, the tail folded into the first
//    lanes, then the same tree.
// Then the bias, then one rounding to the output dtype.
#ifndef TEMB_KERNELS_LINEAR_H_
#define TEMB_KERNELS_LINEAR_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "temb/kernels/cpu_backend.h"
#include "temb/kernels/dtype.h"
#include "temb/kernels/linear_engine.h"

namespace temb {

// out[m * out_features + o] = rnd(bias[o] + sum_k x[m * in_features + k] *
// w[o, k]) for m in [0, rows), summed in float32 in the order above, rnd
// rounding to nearest even in `out_dtype` (fp32, bf16 or fp16; the result
// is stored as the float32 holding that value).  `threads` > 0 splits the
// output features between threads; the result is the same for any count.
// INVALID_ARGUMENT naming the field for spans whose sizes disagree with the
// shapes, a misaligned weight, an fp64 dtype, or threads < 1.
//
// The engine is DefaultCpuIsa()'s (TEMB_CPU_ISA lowers it, as for the
// sinusoid): AVX-512 (with VDPBF16PS for bf16 weights where the CPU has
// AVX512_BF16 and every input is a bf16 value, the case of a bf16 model),
// AVX2 with FMA, or the portable baseline (exact but slow for bf16 weights:
// it reproduces the fused multiply-add and the flush in double).  Each tiles
// rows x features so that a tile of weights is read from memory once for
// many rows, with the tile that fits its registers; the tile never changes
// a bit.  Threads split the output features, never k.
// `params` is borrowed: `weight` is [out_features, in_features] row-major
// and `bias` [out_features] (or empty: no bias), little-endian elements of
// `dtype` (fp32, bf16 or fp16), `weight` aligned to its element size;
// weights are widened to float32 on the fly, nothing is copied.
absl::Status LinearForward(const LinearWeights& params,
                           absl::Span<const float> x, int64_t rows,
                           DType out_dtype, int threads, absl::Span<float> out);

// LinearForward on a given engine (kScalar and kSse2 share the baseline
// one); FAILED_PRECONDITION when this CPU cannot run it.  For tests that
// hold the engines to the same bits.
absl::Status LinearForwardOnIsa(CpuIsa isa, const LinearWeights& params,
                                absl::Span<const float> x, int64_t rows,
                                DType out_dtype, int threads,
                                absl::Span<float> out);

// LinearForward behind the LinearEngine interface, on `threads` threads:
// Upload borrows the host bytes (copies_weights() is false) and Forward
// gives LinearForward's bits.  Named "cpu".
std::unique_ptr<LinearEngine> CreateCpuLinearEngine(int threads);

// The value of `value` rounded to nearest even in `dtype` (fp32: itself),
// as a float32.
float RoundToDType(float value, DType dtype);

}  // namespace temb

#endif  // TEMB_KERNELS_LINEAR_H_
