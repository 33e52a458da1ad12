// CPU kernel throughput: every engine this CPU runs, on the shapes diffusion
// pipelines use, for fp32/fp16/bf16, on one thread and on all of them.
// Memset and memcpy of the same output size run in the same process so that
// results can be read as ratios, which survive a noisy shared machine better
// than absolute numbers.  SinCos/* times the engines' own sin/cos against
// SLEEF's 1-ulp sincosf (the library it replaces below 2^20 rad) on the
// angles of an LDM 1024x1280 embedding.
//
//   temb_kernel_benchmark --benchmark_repetitions=3
//       --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "temb/kernels/cpu_backend.h"
#include "temb/kernels/frequencies.h"

#if TEMB_BENCH_SLEEF_BASELINE
#include "sleef_sincos_baseline.h"
#endif

namespace temb {
namespace {

struct Shape {
  int64_t batch;
  int dim;
  // Every row the same timestep, as a pipeline sends for one denoising step
  // of a batch of images (fp32 only).
  bool one_step = false;
};

constexpr Shape kShapes[] = {
    {1, 320}, {64, 320}, {1024, 1280}, {16384, 1280}, {1024, 1280, true}};
constexpr DType kDTypes[] = {DType::kFloat32, DType::kFloat16,
                             DType::kBFloat16};

std::vector<float> Timesteps(Shape shape) {
  std::vector<float> t(shape.batch);
  for (int64_t n = 0; n < shape.batch; ++n)
    t[n] = static_cast<float>(shape.one_step ? 999 : (n * 37) % 1000);
  return t;
}

void SetCounters(benchmark::State& state, int64_t elements, int64_t bytes) {
  state.SetItemsProcessed(state.iterations() * elements);
  state.SetBytesProcessed(state.iterations() * bytes);
}

void Embed(benchmark::State& state, CpuIsa isa, int threads, DType dtype,
           Shape shape) {
  auto backend = CreateCpuBackendForIsa(isa, threads);
  if (!backend.ok()) {
    state.SkipWithError(std::string(backend.status().message()).c_str());
    return;
  }
  EmbeddingSpec spec;
  spec.dim = shape.dim;
  spec.dtype = dtype;
  const std::vector<float> t = Timesteps(shape);
  std::vector<uint8_t> out(OutputBytes(spec, shape.batch));
  for (auto _ : state) {
    const absl::Status status =
        (*backend)->Compute(spec, t, absl::MakeSpan(out));
    if (!status.ok())
      state.SkipWithError(std::string(status.message()).c_str());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  SetCounters(state, shape.batch * shape.dim, static_cast<int64_t>(out.size()));
}

void Memset(benchmark::State& state, size_t element_size, Shape shape) {
  std::vector<uint8_t> out(shape.batch * shape.dim * element_size);
  int value = 0;
  for (auto _ : state) {
    std::memset(out.data(), ++value, out.size());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  SetCounters(state, shape.batch * shape.dim, static_cast<int64_t>(out.size()));
}

void Memcpy(benchmark::State& state, size_t element_size, Shape shape) {
  const std::vector<uint8_t> in(shape.batch * shape.dim * element_size, 1);
  std::vector<uint8_t> out(in.size());
  for (auto _ : state) {
    std::memcpy(out.data(), in.data(), out.size());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  SetCounters(state, shape.batch * shape.dim, static_cast<int64_t>(out.size()));
}

// The angles t * f_i of an LDM 1024x1280 embedding with the timesteps above.
std::vector<float> LdmAngles() {
  EmbeddingSpec spec;
  spec.dim = 1280;
  const std::vector<float> f = Float32Frequencies(spec);
  const std::vector<float> t = Timesteps({1024, 1280});
  std::vector<float> angles;
  for (float tn : t) {
    for (int i = 0; i < spec.dim / 2; ++i) angles.push_back(tn * f[i]);
  }
  return angles;
}

using SinCosArrayFn = void (*)(const float*, int64_t, float*, float*);

void SinCos(benchmark::State& state, CpuIsa isa, SinCosArrayFn sleef) {
  const std::vector<float> angles = LdmAngles();
  const int64_t n = static_cast<int64_t>(angles.size());
  std::vector<float> s(angles.size()), c(angles.size());
  for (auto _ : state) {
    if (sleef != nullptr) {
      sleef(angles.data(), n, s.data(), c.data());
    } else if (!CpuEngineSinCos(isa, angles.data(), n, s.data(), c.data())
                    .ok()) {
      state.SkipWithError("engine not supported");
    }
    benchmark::DoNotOptimize(s.data());
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  // Two output elements (sin and cos) per angle, as in Embed.
  SetCounters(state, 2 * n, 8 * n);
}

void RegisterSinCos() {
  for (CpuIsa isa : SupportedCpuIsas()) {
    SinCosArrayFn sleef = nullptr;
#if TEMB_BENCH_SLEEF_BASELINE
    if (isa == CpuIsa::kAvx2) sleef = bench::SleefSinCosAvx2;
    if (isa == CpuIsa::kAvx512) sleef = bench::SleefSinCosAvx512;
#endif
    const std::string name = absl::StrCat(CpuIsaName(isa), "/ldm-1024x1280");
    benchmark::RegisterBenchmark(("SinCos/" + name).c_str(), SinCos, isa,
                                 nullptr)
        ->UseRealTime();
    if (sleef != nullptr) {
      benchmark::RegisterBenchmark(("SinCos/sleef-" + name).c_str(), SinCos,
                                   isa, sleef)
          ->UseRealTime();
    }
  }
}

std::string ShapeName(Shape shape) {
  return absl::StrCat(shape.batch, "x", shape.dim,
                      shape.one_step ? "-same-t" : "");
}

void RegisterAll() {
  const int all_threads =
      static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<int> thread_counts = {1};
  if (all_threads > 1) thread_counts.push_back(all_threads);
  for (Shape shape : kShapes) {
    for (DType dtype : kDTypes) {
      if (shape.one_step && dtype != DType::kFloat32) continue;
      const size_t size = DTypeSize(dtype);
      const std::string suffix =
          absl::StrCat(DTypeName(dtype), "/", ShapeName(shape));
      benchmark::RegisterBenchmark(("Memset/" + suffix).c_str(), Memset, size,
                                   shape)
          ->UseRealTime();
      benchmark::RegisterBenchmark(("Memcpy/" + suffix).c_str(), Memcpy, size,
                                   shape)
          ->UseRealTime();
      for (CpuIsa isa : SupportedCpuIsas()) {
        for (int threads : thread_counts) {
          const std::string name = absl::StrCat("Embed/", CpuIsaName(isa), "/",
                                                suffix, "/threads:", threads);
          benchmark::RegisterBenchmark(name.c_str(), Embed, isa, threads, dtype,
                                       shape)
              ->UseRealTime();
        }
      }
    }
  }
}

}  // namespace
}  // namespace temb

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  temb::RegisterAll();
  temb::RegisterSinCos();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
