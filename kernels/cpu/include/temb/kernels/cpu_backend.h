// The CPU backend: vectorised sin/cos with runtime ISA dispatch and threads
// for large batches.
//
// One binary runs on any x86-64: the row engine is compiled once per
// instruction set (scalar, SSE2, AVX2+FMA+F16C, AVX-512F) and the widest one
// the CPU supports is chosen at startup.  The environment variable
// TEMB_CPU_ISA=scalar|sse2|avx2|avx512 lowers that choice (never raises it
// beyond what the CPU supports; unknown values are ignored), e.g. to
// reproduce results of an older machine.
//
// Float32 precision follows eager PyTorch's op order (frequencies.h) with a
// 1-ulp sin/cos (AVX2 and AVX-512: evaluated in double below 2^20 rad,
// correctly rounded but for rare near-halfway cases; otherwise SLEEF's
// u10 sincosf); fp64 precision evaluates angles and sin/cos in
// double and rounds once to the output dtype.  Every engine is within 1 ulp
// of float32 of PyTorch's order evaluated with exact sin/cos, and engines
// differ from each other by at most that ulp in a small fraction of
// elements (fp64 precision is identical on every engine).  Results never
// depend on the number of threads.
#ifndef TEMB_KERNELS_CPU_BACKEND_H_
#define TEMB_KERNELS_CPU_BACKEND_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "temb/kernels/backend.h"

namespace temb {

// Instruction-set levels, in increasing order.
enum class CpuIsa : uint8_t { kScalar = 0, kSse2 = 1, kAvx2 = 2, kAvx512 = 3 };

// "scalar" | "sse2" | "avx2" | "avx512".
absl::string_view CpuIsaName(CpuIsa isa);

// Every level this CPU can run, lowest first (always includes kScalar).
std::vector<CpuIsa> SupportedCpuIsas();

// The level CreateCpuBackend() uses: the widest supported one, lowered by
// TEMB_CPU_ISA when that names a supported lower level.
CpuIsa DefaultCpuIsa();

// `threads`: workers one large request may use (0 = hardware concurrency).
// Small requests (up to ~64K output elements) always run on the calling
// thread.
std::unique_ptr<Backend> CreateCpuBackend(int threads);

// Same, with an explicit engine (tests and benchmarks run every one).
// FAILED_PRECONDITION when this CPU cannot run `isa`.
absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackendForIsa(CpuIsa isa,
                                                                int threads);

// sin and cos of `n` float32 angles exactly as the `isa` engine evaluates
// them inside its rows (the accuracy tests and the benchmarks call it).
// FAILED_PRECONDITION when this CPU cannot run `isa`.
absl::Status CpuEngineSinCos(CpuIsa isa, const float* angles, int64_t n,
                             float* sin_out, float* cos_out);

}  // namespace temb

#endif  // TEMB_KERNELS_CPU_BACKEND_H_
