// EmbeddingSpec: every convention of a sinusoidal timestep embedding, and
// the one place where a request is validated before it reaches a backend.
//
// For D = dim, H = D / 2 (integer division), P = max_period and row n of the
// output (timestep t = timesteps[n]):
//
//   t'  = time_factor * t                        (Flux multiplies by 1000)
//         with timestep_dtype fp16/bf16, as a pipeline of that dtype does:
//         t' = rnd(fl32(rnd(t)) * fl32(time_factor)), rnd rounding to
//         timestep_dtype (PipelineTimesteps below)
//   f_i = exp(-ln(P) * i / (H - downscale_freq_shift)),   i in [0, H)
//         with the exponent's float32 steps in the model's order
//         (ExponentOrder), or the spec's own table of H frequencies
//   a_i = scale * (t' * f_i)
//   halves layout:       [sin(a), cos(a)], or [cos(a), sin(a)] when
//                        flip_sin_to_cos; an odd D appends one 0 at D-1.
//   interleaved layout:  the pair for frequency i sits at (2i, 2i+1) in the
//                        same order (sin, cos) or (cos, sin) when flipped.
//   repeat_only:         every column equals t (no trig, no padding).
//
// Familiar conventions:
//   LDM / ADM / DiT / SD / SDXL / SD3 / Flux:  flip_sin_to_cos=true, shift=0
//   diffusers get_timestep_embedding defaults: flip_sin_to_cos=false, shift=1
//   Transformer PE (Vaswani):  layout=interleaved, flip=false, shift=0
//
// Precision::kFloat32 follows eager PyTorch's float32 op order exactly
// (see frequencies.h) with a correctly rounded exp for the frequencies and a
// sin/cos within 1 ulp (on AVX2/AVX-512 CPUs correctly rounded but for rare
// near-halfway cases).  Measured against diffusers on the CPU (dims 256 and
// 320, DDPM and flow schedules, tests/models/test_fp32_contract.py): 5.7-6.3%
// of elements differ, by at most 2 ulp of the angle where PyTorch's exp
// rounds a frequency the other way (2-3 columns) and by 1 ulp of the output
// elsewhere; every output stays within 1e-6 + 5e-7 |scale * time_factor * t|
// of float64.  Precision::kFloat64 evaluates frequencies and angles in
// double and rounds once to the output dtype (Wan 2.1's original code).
//
// Edge cases, decided here and pinned by tests:
//   * odd D (halves):  exactly D columns, the last one exactly 0.
//   * D == 1:          one column of zeros (diffusers' behaviour), any shift.
//   * H - shift == 0:  INVALID_ARGUMENT (diffusers would silently emit NaN).
//   * odd D with the interleaved layout: INVALID_ARGUMENT (no convention
//     agrees on what the last slot means, so temb refuses to guess).
//   * non-finite timesteps: INVALID_ARGUMENT naming the index.
//   * empty batch:     valid; the result has shape [0, D] and no bytes.
//   * integer timesteps become float32 before anything else (exact to 2^24).
#ifndef TEMB_KERNELS_EMBEDDING_SPEC_H_
#define TEMB_KERNELS_EMBEDDING_SPEC_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "temb/kernels/dtype.h"

namespace temb {

enum class Layout : uint8_t {
  kHalves = 0,       // [first half | second half | optional 0]
  kInterleaved = 1,  // pairs at (2i, 2i+1)
};

// The order in which float32 code evaluates the exponent of f_i; the two
// orders round differently, by up to ~2^-20 relative in f_i.
enum class ExponentOrder : uint8_t {
  // fl32(fl32(-ln P) * i) / fl32(H - shift): diffusers'
  // get_timestep_embedding and most model code.
  kDivideLast = 0,
  // fl32(i * fl32(-ln P / (H - shift))), the slope taken in double first:
  // LongCat-AudioDiT, Ideogram 4, Stable Cascade, RFD4-Proteina
  // (`torch.arange(half) * -(ln P / (H - 1))`).  fp64 precision follows
  // the same order (the two agree to about an ulp of a double there).
  kSlopeFirst = 1,
};

enum class Precision : uint8_t {
  kFloat32 = 0,  // PyTorch float32 op order (default)
  kFloat64 = 1,  // double angles, rounded once to the output dtype
};

absl::string_view LayoutName(Layout layout);  // "halves" | "interleaved"
absl::string_view PrecisionName(Precision precision);  // "fp32" | "fp64"
// "divide_last" | "slope_first"
absl::string_view ExponentOrderName(ExponentOrder order);

// A plain value type; copy freely.  Defaults are the LDM convention that
// almost every modern diffusion model uses; the service makes callers choose
// the convention explicitly (or through a preset).
struct EmbeddingSpec {
  int dim = 0;
  double max_period = 10000.0;
  bool flip_sin_to_cos = true;
  double downscale_freq_shift = 0.0;
  double scale = 1.0;
  double time_factor = 1.0;
  bool repeat_only = false;
  ExponentOrder exponent_order = ExponentOrder::kDivideLast;
  Layout layout = Layout::kHalves;
  DType dtype = DType::kFloat32;
  Precision precision = Precision::kFloat32;
  // The dtype the pipeline holds t in before the embedding: fp32, or fp16 /
  // bf16 for pipelines that cast t to the latents' dtype and multiply by
  // time_factor there (diffusers' Flux: `timestep.to(dtype) * 1000`).
  DType timestep_dtype = DType::kFloat32;
  // Frequencies given instead of the formula f_i = exp(-ln(P) i / (H -
  // shift)): learned ones (Stable Audio's Gaussian Fourier weights) or a
  // generated table (LogSpacedFrequencies).  Exactly dim / 2 finite values,
  // used as they are (rounded to float32 under fp32 precision); max_period
  // and downscale_freq_shift then play no part.  Shared and immutable, so
  // that specs stay cheap to copy.  Null: the formula.
  std::shared_ptr<const std::vector<double>> frequencies;

  int half_dim() const { return dim / 2; }
  // Bytes of one output row.
  int64_t row_bytes() const {
    return static_cast<int64_t>(dim) * static_cast<int64_t>(DTypeSize(dtype));
  }
};

bool operator==(const EmbeddingSpec& a, const EmbeddingSpec& b);
inline bool operator!=(const EmbeddingSpec& a, const EmbeddingSpec& b) {
  return !(a == b);
}

// A one-line human-readable description, e.g. for logs:
// "dim=320 max_period=10000 flip_sin_to_cos=true shift=0 ...".
std::string SpecDebugString(const EmbeddingSpec& spec);

// Service limits.  Exceeding one is RESOURCE_EXHAUSTED (the request is
// well-formed, just too large for this server).
struct Limits {
  int max_dim = 16384;
  int64_t max_batch = 65536;
  int64_t max_output_bytes = int64_t{256} << 20;  // 256 MiB
};

// Checks the spec alone.  INVALID_ARGUMENT for malformed fields (dim < 1,
// non-finite or non-positive max_period, non-finite shift/scale/time_factor,
// H - shift == 0, odd dim with interleaved layout); RESOURCE_EXHAUSTED for
// dim > limits.max_dim.  Messages name the field and the limit, e.g.
// "dim must be in [1, 16384], got 0".
absl::Status ValidateSpec(const EmbeddingSpec& spec, const Limits& limits);

// Checks a batch of timesteps against an already valid spec: batch size and
// output bytes within limits (RESOURCE_EXHAUSTED), every timestep finite and
// every angle and output value finite (INVALID_ARGUMENT naming the index,
// e.g. "timesteps[3] must be finite, got nan").
absl::Status ValidateTimesteps(const EmbeddingSpec& spec,
                               absl::Span<const float> timesteps,
                               const Limits& limits);

// ValidateSpec then ValidateTimesteps.
absl::Status ValidateRequest(const EmbeddingSpec& spec,
                             absl::Span<const float> timesteps,
                             const Limits& limits);

// For a spec with timestep_dtype fp16 or bf16: `timesteps` become the values
// the pipeline's model sees, rnd(fl32(rnd(t)) * fl32(time_factor)) with rnd
// rounding to nearest even in timestep_dtype (fp16/bf16 tensor times a Python
// number computes in float32, then rounds), and `spec` becomes the spec that
// computes the same embedding from them (time_factor 1, timestep_dtype
// fp32).  Identity for fp32.  INVALID_ARGUMENT naming the index when a value
// overflows timestep_dtype (fp16 above 65504).  Call after ValidateSpec.
absl::Status PipelineTimesteps(EmbeddingSpec* spec,
                               absl::Span<float> timesteps);

// Output size in bytes of `batch` rows.  Saturates instead of overflowing.
int64_t OutputBytes(const EmbeddingSpec& spec, int64_t batch);

}  // namespace temb

#endif  // TEMB_KERNELS_EMBEDDING_SPEC_H_
