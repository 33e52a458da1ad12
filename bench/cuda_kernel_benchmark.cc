// CUDA kernel timings for the benchmark suite (bench/run.py --gpu).
//
// Times the fused embedding kernel alone (device memory in and out, CUDA
// events around a burst of launches), next to cudaMemsetAsync of the same
// output in the same process: the ratio is the share of the device's write
// bandwidth the kernel reaches.  Also times the small batches a UNet step
// sends (1..64 x 320), where launch latency dominates; run.py compares those
// with eager PyTorch on the same device.  Last, the device-to-host transfer
// every service response pays, in the ways it can be done.
//
//   temb_cuda_kernel_benchmark
// prints {"large": [{"bytes": B, "dtype": "fp32", "kernel_gbs": x,
// "memset_gbs": y}, ...], "batches": [{"batch": N, "kernel_us": x}, ...],
// "transfers": [{"bytes": B, "d2h_pinned_gbs": x, ...}, ...]}.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "temb/kernels/embed_kernel.cuh"
#include "temb/kernels/embedding_spec.h"
#include "temb/kernels/frequencies.h"

namespace temb {
namespace {

using cuda::OutType;

bool Ok(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return true;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(error));
  return false;
}

size_t ElementBytes(OutType type) {
  switch (type) {
    case OutType::kFloat16:
    case OutType::kBFloat16:
      return 2;
    case OutType::kFloat64:
      return 8;
    default:
      return 4;
  }
}

// Median milliseconds per call of `launch` over `reps` timed bursts of
// `burst` calls each.
template <typename Fn>
double TimeMs(Fn launch, int burst, int reps) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (int i = 0; i < burst; ++i) launch();  // warm-up
  std::vector<double> samples;
  for (int r = 0; r < reps; ++r) {
    cudaEventRecord(start);
    for (int i = 0; i < burst; ++i) launch();
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    samples.push_back(ms / burst);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

struct DeviceRequest {
  cuda::EmbedArgs args;
  std::vector<void*> owned;
};

bool MakeRequest(int64_t rows, int dim, OutType out_type,
                 DeviceRequest* request) {
  EmbeddingSpec spec;
  spec.dim = dim;
  const std::vector<float> freqs = Float32Frequencies(spec);
  std::vector<float> t(rows);
  for (int64_t n = 0; n < rows; ++n) t[n] = static_cast<float>((n * 37) % 1000);
  void *d_t, *d_f, *d_out;
  const size_t out_bytes =
      static_cast<size_t>(rows) * dim * ElementBytes(out_type);
  if (!Ok(cudaMalloc(&d_t, t.size() * sizeof(float)), "cudaMalloc") ||
      !Ok(cudaMalloc(&d_f, freqs.size() * sizeof(float)), "cudaMalloc") ||
      !Ok(cudaMalloc(&d_out, out_bytes), "cudaMalloc")) {
    return false;
  }
  cudaMemcpy(d_t, t.data(), t.size() * sizeof(float), cudaMemcpyHostToDevice);
  cudaMemcpy(d_f, freqs.data(), freqs.size() * sizeof(float),
             cudaMemcpyHostToDevice);
  request->owned = {d_t, d_f, d_out};
  request->args.timesteps = static_cast<const float*>(d_t);
  request->args.frequencies = d_f;
  request->args.out = d_out;
  request->args.rows = rows;
  request->args.dim = dim;
  request->args.out_type = out_type;
  return true;
}

void Free(DeviceRequest* request) {
  for (void* p : request->owned) cudaFree(p);
}

// Median wall-clock milliseconds per call of a synchronous `call` over
// `reps` bursts of `burst` calls.
template <typename Fn>
double WallMs(Fn call, int burst, int reps) {
  call();  // warm-up
  std::vector<double> samples;
  for (int r = 0; r < reps; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < burst; ++i) call();
    samples.push_back(std::chrono::duration<double, std::milli>(
                          std::chrono::steady_clock::now() - start)
                          .count() /
                      burst);
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

// The ways a result can reach pageable host memory (where a gRPC response
// lives), timed for one output of `bytes`: the transfer alone into pinned
// memory (the limit), that plus the host copy on (what a staging buffer
// costs), the transfer straight into pageable memory, and pinning the
// destination for the transfer.  GB/s of output, median of 7 bursts of 5.
bool Transfers(size_t bytes, bool first) {
  void* device = nullptr;
  void* pinned = nullptr;
  if (!Ok(cudaMalloc(&device, bytes), "cudaMalloc") ||
      !Ok(cudaMallocHost(&pinned, bytes), "cudaMallocHost")) {
    return false;
  }
  std::vector<uint8_t> pageable(bytes, 1);
  cudaMemset(device, 0, bytes);
  auto gbs = [bytes](double ms) { return bytes / ms / 1e6; };
  auto d2h_pinned = [&] {
    cudaMemcpy(pinned, device, bytes, cudaMemcpyDeviceToHost);
  };
  auto staged = [&] {
    cudaMemcpy(pinned, device, bytes, cudaMemcpyDeviceToHost);
    std::memcpy(pageable.data(), pinned, bytes);
  };
  auto d2h_pageable = [&] {
    cudaMemcpy(pageable.data(), device, bytes, cudaMemcpyDeviceToHost);
  };
  auto registered = [&] {
    cudaHostRegister(pageable.data(), bytes, cudaHostRegisterDefault);
    cudaMemcpy(pageable.data(), device, bytes, cudaMemcpyDeviceToHost);
    cudaHostUnregister(pageable.data());
  };
  std::printf(
      "%s{\"bytes\": %zu, \"d2h_pinned_gbs\": %.3f, \"staged_gbs\": %.3f, "
      "\"d2h_pageable_gbs\": %.3f, \"registered_gbs\": %.3f}",
      first ? "" : ", ", bytes, gbs(WallMs(d2h_pinned, 5, 7)),
      gbs(WallMs(staged, 5, 7)), gbs(WallMs(d2h_pageable, 5, 7)),
      gbs(WallMs(registered, 5, 7)));
  const bool ok = Ok(cudaGetLastError(), "transfers");
  cudaFreeHost(pinned);
  cudaFree(device);
  return ok;
}

int Run() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "no usable CUDA device\n");
    return 1;
  }
  // Outputs from the 256 MiB of the target to 1 GiB, far past the L2, so
  // both the kernel and the memset stream to HBM.
  struct Large {
    int64_t rows;
    OutType type;
    const char* name;
  };
  const Large kLarge[] = {{65536, OutType::kFloat32, "fp32"},
                          {262144, OutType::kFloat32, "fp32"},
                          {524288, OutType::kBFloat16, "bf16"},
                          {524288, OutType::kFloat16, "fp16"}};
  constexpr int kLargeDim = 1024;
  std::printf("{\"large\": [");
  for (const Large& shape : kLarge) {
    DeviceRequest large;
    if (!MakeRequest(shape.rows, kLargeDim, shape.type, &large)) return 1;
    const size_t bytes =
        static_cast<size_t>(shape.rows) * kLargeDim * ElementBytes(shape.type);
    const double kernel_ms =
        TimeMs([&] { cuda::LaunchEmbed(large.args, nullptr); }, 5, 7);
    const double memset_ms =
        TimeMs([&] { cudaMemsetAsync(large.args.out, 1, bytes); }, 5, 7);
    if (!Ok(cudaGetLastError(), "large")) return 1;
    std::printf(
        "%s{\"bytes\": %zu, \"dtype\": \"%s\", \"kernel_gbs\": %.3f, "
        "\"memset_gbs\": %.3f}",
        &shape == kLarge ? "" : ", ", bytes, shape.name,
        bytes / kernel_ms / 1e6, bytes / memset_ms / 1e6);
    Free(&large);
  }
  std::printf("], \"batches\": [");

  const int kBatches[] = {1, 2, 4, 8, 16, 32, 64};
  bool first = true;
  for (int batch : kBatches) {
    DeviceRequest small;
    if (!MakeRequest(batch, 320, OutType::kFloat32, &small)) return 1;
    const double ms =
        TimeMs([&] { cuda::LaunchEmbed(small.args, nullptr); }, 200, 7);
    if (!Ok(cudaGetLastError(), "small")) return 1;
    std::printf("%s{\"batch\": %d, \"kernel_us\": %.3f}", first ? "" : ", ",
                batch, ms * 1e3);
    first = false;
    Free(&small);
  }
  std::printf("], \"transfers\": [");
  first = true;
  for (size_t mib : {1, 5, 20}) {
    if (!Transfers(mib << 20, first)) return 1;
    first = false;
  }
  std::printf("]}\n");
  return 0;
}

}  // namespace
}  // namespace temb

int main() { return temb::Run(); }
