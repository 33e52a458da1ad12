// The conditioning Linear on one Qwen-Image block's shape (in 3072, out
// 18432 = 6D), every engine this CPU runs, bf16 and fp32 weights, 1, 16 and
// 50 rows, next to a plain read of the same weight bytes in the same run: at
// one row the Linear is a read of its weights, so that ratio is its
// efficiency; at 50 rows it is compute-bound (GFLOP/s).  Prints the median
// of --runs timings per case.
//
//   temb_linear_benchmark [threads=2] [runs=7] [isa=all|avx512|avx2|sse2]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "temb/kernels/linear.h"

namespace temb {
namespace {

constexpr int64_t kIn = 3072;
constexpr int64_t kOut = 6 * kIn;

template <typename F>
double MedianSeconds(int runs, F&& run) {
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

// A plain read: 64-bit words summed by `threads` threads, each its own
// contiguous share, the loop the compiler vectorises.
uint64_t ReadAll(const uint8_t* data, int64_t bytes, int threads) {
  const int64_t words = bytes / 8;
  uint64_t total = 0;
#pragma omp parallel for num_threads(threads) reduction(+ : total) \
    schedule(static)
  for (int64_t i = 0; i < words; ++i) {
    uint64_t word;
    __builtin_memcpy(&word, data + 8 * i, 8);
    total += word;
  }
  return total;
}

int Main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const int runs = argc > 2 ? std::atoi(argv[2]) : 7;
  const std::string only = argc > 3 ? argv[3] : "all";
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<uint16_t> bf16(kIn * kOut);
  std::vector<float> fp32(kIn * kOut);
  for (int64_t i = 0; i < kIn * kOut; ++i) {
    bf16[i] = FloatToBFloat16(normal(rng) / 55.0f);
    fp32[i] = BFloat16ToFloat(bf16[i]);
  }
  std::printf("Linear %lld -> %lld, %d threads, median of %d\n",
              static_cast<long long>(kIn), static_cast<long long>(kOut),
              threads, runs);
  for (DType dtype : {DType::kBFloat16, DType::kFloat32}) {
    const auto* data = dtype == DType::kBFloat16
                           ? reinterpret_cast<const uint8_t*>(bf16.data())
                           : reinterpret_cast<const uint8_t*>(fp32.data());
    const int64_t bytes = kIn * kOut * (dtype == DType::kBFloat16 ? 2 : 4);
    volatile uint64_t sink = 0;
    const double read = MedianSeconds(
        runs, [&] { sink = sink + ReadAll(data, bytes, threads); });
    std::printf("plain read %s: %8.2f ms %6.1f GB/s\n",
                std::string(DTypeName(dtype)).c_str(), read * 1e3,
                bytes / read / 1e9);
    for (CpuIsa isa : SupportedCpuIsas()) {
      const std::string name(CpuIsaName(isa));
      if (isa == CpuIsa::kScalar || (only != "all" && only != name)) continue;
      for (int64_t rows : {1, 16, 50}) {
        std::vector<float> x(rows * kIn), out(rows * kOut);
        for (float& v : x) v = BFloat16ToFloat(FloatToBFloat16(normal(rng)));
        LinearWeights params;
        params.weight = absl::MakeConstSpan(data, bytes);
        params.dtype = dtype;
        params.in_features = kIn;
        params.out_features = kOut;
        const double seconds = MedianSeconds(runs, [&] {
          const absl::Status status = LinearForwardOnIsa(
              isa, params, x, rows, dtype, threads, absl::MakeSpan(out));
          if (!status.ok()) {
            std::fprintf(stderr, "%s\n", status.ToString().c_str());
            std::exit(1);
          }
        });
        std::printf(
            "%-6s %s rows %2lld: %8.2f ms %6.1f GFLOP/s %6.1f GB/s "
            "(%.2fx the read)\n",
            name.c_str(), std::string(DTypeName(dtype)).c_str(),
            static_cast<long long>(rows), seconds * 1e3,
            2.0 * rows * kIn * kOut / seconds / 1e9, bytes / seconds / 1e9,
            read / seconds);
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace temb

int main(int argc, char** argv) { return temb::Main(argc, argv); }
