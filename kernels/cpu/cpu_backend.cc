#include "temb/kernels/cpu_backend.h"

#include <pthread.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "absl/strings/str_cat.h"
#include "cpu_kernel.h"
#include "temb/kernels/dtype.h"
#include "temb/kernels/frequencies.h"

namespace temb {
namespace {

// Requests up to this many output elements run on the calling thread: waking
// a team costs more than computing them.
constexpr int64_t kMinParallelElements = int64_t{1} << 16;
// Each extra thread gets at least this many elements.
constexpr int64_t kMinElementsPerThread = int64_t{1} << 15;

#if defined(__x86_64__)
// CPUID directly: clang before 15 rejects "f16c" in __builtin_cpu_supports.
bool HasF16c() {
  unsigned eax, ebx, ecx, edx;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
}
#endif

bool IsaSupported(CpuIsa isa) {
#if defined(__x86_64__)
  switch (isa) {
    case CpuIsa::kScalar:
    case CpuIsa::kSse2:
      return true;  // SSE2 is part of x86-64
    case CpuIsa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             HasF16c();
    case CpuIsa::kAvx512:
      return __builtin_cpu_supports("avx512f");
  }
  return false;
#else
  return isa == CpuIsa::kScalar;
#endif
}

// The entry points of one engine.
struct Engine {
  Float32RowsFn rows;
  SinCosFn sin_cos;
};

Engine EngineFor(CpuIsa isa) {
  switch (isa) {
#if defined(__x86_64__)
    case CpuIsa::kSse2:
      return {cpu_sse2::ComputeFloat32Rows, cpu_sse2::SinCos};
    case CpuIsa::kAvx2:
      return {cpu_avx2::ComputeFloat32Rows, cpu_avx2::SinCos};
    case CpuIsa::kAvx512:
      return {cpu_avx512::ComputeFloat32Rows, cpu_avx512::SinCos};
#endif
    default:
      return {cpu_scalar::ComputeFloat32Rows, cpu_scalar::SinCos};
  }
}

// Each calling thread keeps its last few frequency tables.
struct FrequencyTable {
  bool valid = false;
  FrequencyKey key;
  std::vector<float> f32;   // zero-padded to a multiple of kMaxLanes
  std::vector<double> f64;  // exactly half_dim values
};

const FrequencyTable& CachedFrequencies(const EmbeddingSpec& spec) {
  constexpr int kEntries = 4;
  thread_local std::array<FrequencyTable, kEntries> cache;
  thread_local int next_victim = 0;
  const FrequencyKey key = FrequencyKey::Of(spec);
  for (const FrequencyTable& entry : cache) {
    if (entry.valid && entry.key == key) {
      return entry;
    }
  }
  FrequencyTable& entry = cache[next_victim];
  next_victim = (next_victim + 1) % kEntries;
  entry.valid = true;
  entry.key = key;
  entry.f32.clear();
  entry.f64.clear();
  if (spec.precision == Precision::kFloat64) {
    entry.f64 = Float64Frequencies(spec);
  } else {
    entry.f32 = Float32Frequencies(spec);
    const size_t padded =
        (entry.f32.size() + kMaxLanes - 1) / kMaxLanes * kMaxLanes;
    entry.f32.resize(std::max<size_t>(padded, kMaxLanes), 0.0f);
  }
  return entry;
}

// Writes `value` rounded once to `dtype`.
void StoreDouble(double value, DType dtype, uint8_t* dst) {
  switch (dtype) {
    case DType::kFloat32: {
      const float v = static_cast<float>(value);
      std::memcpy(dst, &v, 4);
      return;
    }
    case DType::kFloat16: {
      const uint16_t v = DoubleToHalf(value);
      std::memcpy(dst, &v, 2);
      return;
    }
    case DType::kBFloat16: {
      const uint16_t v = DoubleToBFloat16(value);
      std::memcpy(dst, &v, 2);
      return;
    }
    case DType::kFloat64:
      std::memcpy(dst, &value, 8);
      return;
  }
}

// Precision::kFloat64: angles in double, one rounding at the end.  Plain
// libm sin/cos (correctly rounded in practice) keep this path simple; it is
// the accurate mode, not the fast one.
void Float64Rows(const EmbeddingSpec& spec, const double* freqs,
                 const float* timesteps, int64_t rows, uint8_t* out) {
  const int half = spec.half_dim();
  const size_t size = DTypeSize(spec.dtype);
  for (int64_t n = 0; n < rows; ++n) {
    uint8_t* row = out + n * spec.row_bytes();
    const double t = static_cast<double>(timesteps[n]) * spec.time_factor;
    for (int i = 0; i < half; ++i) {
      const double a = t * freqs[i] * spec.scale;
      const double s = std::sin(a);
      const double c = std::cos(a);
      const double first = spec.flip_sin_to_cos ? c : s;
      const double second = spec.flip_sin_to_cos ? s : c;
      const int first_col = spec.layout == Layout::kInterleaved ? 2 * i : i;
      const int second_col =
          spec.layout == Layout::kInterleaved ? 2 * i + 1 : half + i;
      StoreDouble(first, spec.dtype, row + first_col * size);
      StoreDouble(second, spec.dtype, row + second_col * size);
    }
    if (spec.dim & 1) std::memset(row + (spec.dim - 1) * size, 0, size);
  }
}

// repeat_only: every column is the timestep itself, in the output dtype.
void RepeatRows(const EmbeddingSpec& spec, const float* timesteps, int64_t rows,
                uint8_t* out) {
  const size_t size = DTypeSize(spec.dtype);
  for (int64_t n = 0; n < rows; ++n) {
    uint8_t element[8];
    StoreDouble(timesteps[n], spec.dtype, element);  // exact from float
    uint8_t* row = out + n * spec.row_bytes();
    for (int j = 0; j < spec.dim; ++j)
      std::memcpy(row + j * size, element, size);
  }
}

bool SameBits(float a, float b) {
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;
}

// Pipelines embed one timestep for every image of a denoising step (twice
// over with classifier-free guidance), so batches are often runs of equal
// timesteps.  A row depends only on its timestep, so compute(begin, end)
// runs over the rows that differ from the row before, and the others are
// copies of it: the same bytes, at memcpy speed.  Bit equality, because
// -0 and +0 give different rows (sin(-0) = -0).
template <typename Compute>
void ComputeOncePerRepeat(const float* t, int64_t rows, int64_t row_bytes,
                          uint8_t* out, const Compute& compute) {
  int64_t begin = 0;
  while (begin < rows) {
    int64_t end = begin + 1;
    while (end < rows && !SameBits(t[end], t[end - 1])) ++end;
    compute(begin, end);
    for (; end < rows && SameBits(t[end], t[end - 1]); ++end) {
      std::memcpy(out + end * row_bytes, out + (end - 1) * row_bytes,
                  static_cast<size_t>(row_bytes));
    }
    begin = end;
  }
}

// GNU OpenMP does not survive fork(): the child of a process whose thread
// has run a team waits forever for the parent's pool threads, which it does
// not have.  The team may be another library's sharing the runtime (PyTorch
// ships the same libgomp), so a process forked after a CPU backend was made
// (say a data-loader worker forked from a pipeline that computes in
// process) computes on the calling thread.
std::atomic<bool> forked_child{false};

void NoteForkInChild() { forked_child.store(true, std::memory_order_relaxed); }

void WatchForFork() {
  static const bool registered =
      pthread_atfork(nullptr, nullptr, NoteForkInChild) == 0;
  (void)registered;
}

// Calls fn(begin, end) over disjoint row ranges covering [0, rows), on up to
// `threads` OpenMP threads when the request is large enough to benefit.
template <typename Fn>
void ForEachRowRange(int64_t rows, int dim, int threads, const Fn& fn) {
  const int64_t elements = rows * dim;
  int64_t ranges = 1;
  if (elements > kMinParallelElements &&
      !forked_child.load(std::memory_order_relaxed)) {
    ranges =
        std::min<int64_t>({threads, rows, elements / kMinElementsPerThread});
  }
  if (ranges <= 1) {
    fn(int64_t{0}, rows);
    return;
  }
#pragma omp parallel for num_threads(static_cast <int>(ranges)) \
    schedule(static, 1)
  for (int64_t r = 0; r < ranges; ++r) {
    fn(rows * r / ranges, rows * (r + 1) / ranges);
  }
}

class CpuBackend final : public Backend {
 public:
  CpuBackend(CpuIsa isa, int threads)
      : isa_(isa),
        engine_(EngineFor(isa).rows),
        threads_(threads > 0 ? threads
                             : static_cast<int>(std::max(
                                   1u, std::thread::hardware_concurrency()))) {
    WatchForFork();
  }

  BackendKind kind() const override { return BackendKind::kCpu; }

  std::string device() const override {
#if defined(__x86_64__)
    constexpr absl::string_view kArch = "x86-64";
#else
    constexpr absl::string_view kArch = "cpu";
#endif
    return absl::StrCat(kArch, " ", CpuIsaName(isa_), ", ", threads_,
                        threads_ == 1 ? " thread" : " threads");
  }

  absl::Status Compute(const EmbeddingSpec& spec,
                       absl::Span<const float> timesteps,
                       absl::Span<uint8_t> out) override {
    const int64_t rows = static_cast<int64_t>(timesteps.size());
    if (rows == 0) return absl::OkStatus();
    const float* t = timesteps.data();
    const int64_t row_bytes = spec.row_bytes();

    if (spec.repeat_only) {
      ForEachRowRange(rows, spec.dim, threads_,
                      [&](int64_t begin, int64_t end) {
                        RepeatRows(spec, t + begin, end - begin,
                                   out.data() + begin * row_bytes);
                      });
      return absl::OkStatus();
    }
    const FrequencyTable& freqs = CachedFrequencies(spec);
    if (spec.precision == Precision::kFloat64) {
      ForEachRowRange(
          rows, spec.dim, threads_, [&](int64_t begin, int64_t end) {
            uint8_t* range_out = out.data() + begin * row_bytes;
            ComputeOncePerRepeat(t + begin, end - begin, row_bytes, range_out,
                                 [&](int64_t first, int64_t last) {
                                   Float64Rows(spec, freqs.f64.data(),
                                               t + begin + first, last - first,
                                               range_out + first * row_bytes);
                                 });
          });
      return absl::OkStatus();
    }
    Float32RowJob job;
    job.freqs = freqs.f32.data();
    job.dim = spec.dim;
    job.half_dim = spec.half_dim();
    job.time_factor = static_cast<float>(spec.time_factor);
    job.apply_time_factor = spec.time_factor != 1.0;
    job.scale = static_cast<float>(spec.scale);
    job.apply_scale = spec.scale != 1.0;
    job.flip_sin_to_cos = spec.flip_sin_to_cos;
    job.layout = spec.layout;
    job.dtype = spec.dtype;
    const Float32RowsFn engine = engine_;
    ForEachRowRange(rows, spec.dim, threads_, [&](int64_t begin, int64_t end) {
      uint8_t* range_out = out.data() + begin * row_bytes;
      ComputeOncePerRepeat(t + begin, end - begin, row_bytes, range_out,
                           [&](int64_t first, int64_t last) {
                             engine(job, t + begin + first, last - first,
                                    range_out + first * row_bytes);
                           });
    });
    return absl::OkStatus();
  }

 private:
  const CpuIsa isa_;
  const Float32RowsFn engine_;
  const int threads_;
};

CpuIsa ComputeDefaultCpuIsa() {
  CpuIsa best = CpuIsa::kScalar;
  for (CpuIsa isa : SupportedCpuIsas()) best = isa;
  const char* forced = std::getenv("TEMB_CPU_ISA");
  if (forced == nullptr) return best;
  for (CpuIsa isa :
       {CpuIsa::kScalar, CpuIsa::kSse2, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (CpuIsaName(isa) == forced && isa < best) return isa;
  }
  return best;
}

}  // namespace

absl::string_view CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar:
      return "scalar";
    case CpuIsa::kSse2:
      return "sse2";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

std::vector<CpuIsa> SupportedCpuIsas() {
  std::vector<CpuIsa> isas;
  for (CpuIsa isa :
       {CpuIsa::kScalar, CpuIsa::kSse2, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (IsaSupported(isa)) isas.push_back(isa);
  }
  return isas;
}

CpuIsa DefaultCpuIsa() {
  static const CpuIsa isa = ComputeDefaultCpuIsa();
  return isa;
}

std::unique_ptr<Backend> CreateCpuBackend(int threads) {
  return std::make_unique<CpuBackend>(DefaultCpuIsa(), threads);
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackendForIsa(CpuIsa isa,
                                                                int threads) {
  if (!IsaSupported(isa)) {
    return absl::FailedPreconditionError(
        absl::StrCat("this CPU cannot run the ", CpuIsaName(isa), " engine"));
  }
  return std::unique_ptr<Backend>(std::make_unique<CpuBackend>(isa, threads));
}

absl::Status CpuEngineSinCos(CpuIsa isa, const float* angles, int64_t n,
                             float* sin_out, float* cos_out) {
  if (!IsaSupported(isa)) {
    return absl::FailedPreconditionError(
        absl::StrCat("this CPU cannot run the ", CpuIsaName(isa), " engine"));
  }
  EngineFor(isa).sin_cos(angles, n, sin_out, cos_out);
  return absl::OkStatus();
}

}  // namespace temb
