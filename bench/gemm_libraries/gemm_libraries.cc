// The GEMM libraries Debian 12 ships, on the conditioning Linear's shape
// (rows x 3072 times a [18432, 3072] weight, as a Qwen-Image block's
// modulation), for the choice of the CPU kernel (docs/conditioning.md,
// "Choosing the CPU GEMM"): their time next to temb's Linear in the same
// process, and whether their rows are batch-invariant: is a row's result
// the same bits computed alone, inside 50 rows, and at 1 and 2 threads?
// Not part of the build (the libraries are not dependencies); one binary per
// library, each with its own symbols:
//
//   bench/gemm_libraries/run.sh build   (compiles and runs all three)
//
// TEMB_GEMM_OPENBLAS: cblas_sgemm (fp32; Debian's 0.3.21 is built without
// the bf16 cblas_sbgemm).  TEMB_GEMM_BLIS: sgemm_ (fp32; BLIS 0.9 has no bf16).
// TEMB_GEMM_DNNL: oneDNN's matmul, fp32 and bf16 (f32 out).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "temb/kernels/linear.h"

#if defined(TEMB_GEMM_OPENBLAS)
#include <cblas.h>
#elif defined(TEMB_GEMM_DNNL)
#include "dnnl.hpp"
#elif defined(TEMB_GEMM_BLIS)
extern "C" void sgemm_(const char* transa, const char* transb, const int* m,
                       const int* n, const int* k, const float* alpha,
                       const float* a, const int* lda, const float* b,
                       const int* ldb, const float* beta, float* c,
                       const int* ldc);
extern "C" void bli_thread_set_num_threads(long n);
#endif

namespace {

constexpr int kIn = 3072;
constexpr int kOut = 6 * kIn;

// y[rows, kOut] = x[rows, kIn] W^T, W [kOut, kIn] in `bf16` or `fp32`.
using Gemm =
    std::function<void(const float* x, int rows, int threads, float* y)>;

double MedianSeconds(int runs, const std::function<void()>& run) {
  std::vector<double> times;
  for (int i = 0; i < runs; ++i) {
    const auto start = std::chrono::steady_clock::now();
    run();
    times.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Batch invariance: each of the 50 rows computed alone at 1 thread against
// the same row inside batches of 2, 7, 16 and 50 rows at 1, 2 and 4 threads.
void Report(const char* name, const char* dtype, const Gemm& gemm,
            const std::vector<float>& x, int runs, const Gemm* temb = nullptr) {
  std::vector<float> alone(50 * kOut);
  for (int m = 0; m < 50; ++m) {
    gemm(x.data() + m * kIn, 1, 1, alone.data() + m * kOut);
  }
  int cases = 0, differing = 0;
  std::string where;
  for (int rows : {2, 7, 16, 50}) {
    for (int threads : {1, 2, 4}) {
      std::vector<float> batch(rows * kOut);
      gemm(x.data(), rows, threads, batch.data());
      int rows_differing = 0;
      for (int m = 0; m < rows; ++m) {
        rows_differing += std::memcmp(batch.data() + m * kOut,
                                      alone.data() + m * kOut, kOut * 4) != 0;
      }
      ++cases;
      if (rows_differing != 0) {
        ++differing;
        where += " " + std::to_string(rows_differing) + "/" +
                 std::to_string(rows) + "@" + std::to_string(threads) + "t";
      }
    }
  }
  // A fingerprint of the 50 rows' bits, to compare between instruction
  // sets (TEMB_CPU_ISA=avx2, ONEDNN_MAX_CPU_ISA=AVX2, ...).
  uint64_t hash = 1469598103934665603ull;
  for (float v : alone) {
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    hash = (hash ^ bits) * 1099511628211ull;
  }
  std::printf(
      "%-9s %-4s batch-invariant: %s (%d of %d batch x thread cases "
      "differ from rows alone%s%s); bits %016llx\n",
      name, dtype, differing == 0 ? "yes" : "NO", differing, cases,
      where.empty() ? "" : ":", where.c_str(),
      static_cast<unsigned long long>(hash));
  if (temb == nullptr) return;
  // Timed alternately with temb's Linear on the same weights, run by run,
  // so that a shared machine's load falls on both alike.
  for (int rows : {1, 16, 50}) {
    std::vector<float> y(rows * kOut);
    std::vector<double> theirs, ours;
    for (int run = 0; run < runs; ++run) {
      theirs.push_back(
          MedianSeconds(1, [&] { gemm(x.data(), rows, 2, y.data()); }));
      ours.push_back(
          MedianSeconds(1, [&] { (*temb)(x.data(), rows, 2, y.data()); }));
    }
    std::sort(theirs.begin(), theirs.end());
    std::sort(ours.begin(), ours.end());
    const double t = theirs[runs / 2], o = ours[runs / 2];
    std::printf(
        "%-9s %-4s rows %2d: %8.2f ms %6.1f GFLOP/s | temb %8.2f ms "
        "%6.1f GFLOP/s | temb %.2fx its speed\n",
        name, dtype, rows, t * 1e3, 2.0 * rows * kIn * kOut / t / 1e9, o * 1e3,
        2.0 * rows * kIn * kOut / o / 1e9, t / o);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const int runs = argc > 1 ? std::atoi(argv[1]) : 7;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<uint16_t> w16(size_t{kIn} * kOut);
  std::vector<float> w32(w16.size());
  for (size_t i = 0; i < w16.size(); ++i) {
    w16[i] = temb::FloatToBFloat16(normal(rng) / 55.0f);
    w32[i] = temb::BFloat16ToFloat(w16[i]);
  }
  // bf16 values, as a bf16 model's Linear inputs are.
  std::vector<float> x(50 * kIn);
  std::vector<uint16_t> x16(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    x16[i] = temb::FloatToBFloat16(normal(rng));
    x[i] = temb::BFloat16ToFloat(x16[i]);
  }

  auto temb_linear = [&](temb::DType dtype) -> Gemm {
    return [&, dtype](const float* in, int rows, int threads, float* y) {
      temb::LinearWeights params;
      params.dtype = dtype;
      params.in_features = kIn;
      params.out_features = kOut;
      params.weight = dtype == temb::DType::kBFloat16
                          ? absl::MakeConstSpan(
                                reinterpret_cast<const uint8_t*>(w16.data()),
                                w16.size() * 2)
                          : absl::MakeConstSpan(
                                reinterpret_cast<const uint8_t*>(w32.data()),
                                w32.size() * 4);
      const absl::Status status = temb::LinearForward(
          params, absl::MakeConstSpan(in, size_t(rows) * kIn), rows,
          temb::DType::kFloat32, threads,
          absl::MakeSpan(y, size_t(rows) * kOut));
      if (!status.ok()) std::abort();
    };
  };
  const Gemm temb_bf16 = temb_linear(temb::DType::kBFloat16);
  const Gemm temb_fp32 = temb_linear(temb::DType::kFloat32);
  Report("temb", "bf16", temb_bf16, x, runs);
  Report("temb", "fp32", temb_fp32, x, runs);

#if defined(TEMB_GEMM_OPENBLAS)
  Report(
      "openblas", "fp32",
      [&](const float* in, int rows, int threads, float* y) {
        openblas_set_num_threads(threads);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, kOut, kIn,
                    1.0f, in, kIn, w32.data(), kIn, 0.0f, y, kOut);
      },
      x, runs, &temb_fp32);
#elif defined(TEMB_GEMM_BLIS)
  Report(
      "blis", "fp32",
      [&](const float* in, int rows, int threads, float* y) {
        bli_thread_set_num_threads(threads);
        // Column-major: y^T [kOut, rows] = W [kOut, kIn] (stored as
        // W^T column-major) x^T.
        const char t = 'T', n = 'N';
        const int m = kOut, nn = rows, k = kIn, ld_out = kOut;
        const float one = 1, zero = 0;
        sgemm_(&t, &n, &m, &nn, &k, &one, w32.data(), &k, in, &k, &zero, y,
               &ld_out);
      },
      x, runs, &temb_fp32);
#elif defined(TEMB_GEMM_DNNL)
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  using tag = dnnl::memory::format_tag;
  using dt = dnnl::memory::data_type;
  for (const bool bf16 : {true, false}) {
    // oneDNN 2.6 has no bf16 matmul below AVX-512 (ONEDNN_MAX_CPU_ISA=AVX2).
    try {
      Report(
          "onednn", bf16 ? "bf16" : "fp32",
          [&, bf16](const float* in, int rows, int threads, float* y) {
            omp_set_num_threads(threads);
            const dt type = bf16 ? dt::bf16 : dt::f32;
            const dnnl::memory::desc src({rows, kIn}, type, tag::ab);
            // W [kOut, kIn] row-major read as [kIn, kOut]: tag ba.
            const dnnl::memory::desc weights({kIn, kOut}, type, tag::ba);
            const dnnl::memory::desc dst({rows, kOut}, dt::f32, tag::ab);
            // oneDNN 2.x: an operation descriptor, then its primitive.
            const dnnl::matmul::primitive_desc pd(
                dnnl::matmul::desc(src, weights, dst), engine);
            const void* src_data =
                bf16 ? static_cast<const void*>(x16.data() + (in - x.data()))
                     : static_cast<const void*>(in);
            const void* w_data = bf16 ? static_cast<const void*>(w16.data())
                                      : static_cast<const void*>(w32.data());
            dnnl::memory src_mem(src, engine, const_cast<void*>(src_data));
            dnnl::memory w_mem(weights, engine, const_cast<void*>(w_data));
            dnnl::memory dst_mem(dst, engine, y);
            dnnl::matmul(pd).execute(stream, {{DNNL_ARG_SRC, src_mem},
                                              {DNNL_ARG_WEIGHTS, w_mem},
                                              {DNNL_ARG_DST, dst_mem}});
            stream.wait();
          },
          x, runs, bf16 ? &temb_bf16 : &temb_fp32);
    } catch (const dnnl::error& error) {
      std::printf("onednn    %s not available: %s\n", bf16 ? "bf16" : "fp32",
                  error.what());
    }
  }
#endif
  return 0;
}
