// The CUDA backend: host-side orchestration around the fused kernel.
//
// Each Compute() borrows a CallContext (a stream, a device buffer and a pinned
// host staging buffer) from a pool and returns it afterwards, so concurrent
// calls never share a stream and steady-state calls allocate nothing.  One
// call is: staging <- [frequencies | timesteps]; one H2D copy; one launch;
// one D2H copy into the staging buffer; synchronise; memcpy to the caller.
// The staging buffer serves both directions: stream order guarantees the H2D
// copy has finished reading it before the D2H copy overwrites it.
//
// When the caller computes into memory this backend lent (AllocateOutput:
// page-locked, from a PinnedPool), the D2H copy goes straight there and the
// host copy disappears.  That copy is the expensive part of a large output:
// on the H100 machine of docs/benchmarks-gpu.md the device writes pinned
// memory at about 50 GB/s, while any route into ordinary memory runs at the
// host's copy speed, about 10 GB/s.
//
// Every CUDA error becomes an absl::Status at the first host boundary
// (cuda_status.h).
#include "temb/kernels/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "call_context.h"
#include "cuda_status.h"
#include "pinned_pool.h"
#include "temb/base/status_macros.h"
#include "temb/kernels/embed_kernel.cuh"

namespace temb {
namespace cuda {
namespace {

size_t RoundUp(size_t value, size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

OutType ToOutType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return OutType::kFloat32;
    case DType::kFloat16:
      return OutType::kFloat16;
    case DType::kBFloat16:
      return OutType::kBFloat16;
    case DType::kFloat64:
      return OutType::kFloat64;
  }
  return OutType::kFloat32;
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, std::string description)
      : device_(device),
        description_(std::move(description)),
        pinned_(std::make_shared<PinnedPool>()) {}

  BackendKind kind() const override { return BackendKind::kCuda; }
  std::string device() const override { return description_; }

  std::unique_ptr<HostBuffer> AllocateOutput(size_t bytes) override {
    // Below this the staging copy costs about what a pool round trip does.
    if (bytes < PinnedPool::kMinCapacity) return nullptr;
    if (cudaSetDevice(device_) != cudaSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    return pinned_->Lend(bytes);
  }

  absl::Status Compute(const EmbeddingSpec& spec,
                       absl::Span<const float> timesteps,
                       absl::Span<uint8_t> out) override {
    if (timesteps.empty()) return absl::OkStatus();
    // The current device is per thread and callers' threads are arbitrary.
    RETURN_IF_ERROR(Check(cudaSetDevice(device_), "cudaSetDevice"));
    ASSIGN_OR_RETURN(std::unique_ptr<CallContext> context, Acquire());
    absl::Status status =
        Run(spec, timesteps, out, pinned_->IsLent(out), *context);
    // A failed context may still have work queued or a half-grown buffer:
    // drop it rather than hand it to the next call.
    if (status.ok()) Release(std::move(context));
    return status;
  }

 private:
  absl::StatusOr<std::unique_ptr<CallContext>> Acquire() {
    {
      absl::MutexLock lock(&mu_);
      if (!idle_.empty()) {
        std::unique_ptr<CallContext> context = std::move(idle_.back());
        idle_.pop_back();
        return context;
      }
    }
    return CallContext::Create();
  }

  void Release(std::unique_ptr<CallContext> context) {
    absl::MutexLock lock(&mu_);
    idle_.push_back(std::move(context));
  }

  // `out_pinned`: `out` is page-locked, so the device writes it directly.
  static absl::Status Run(const EmbeddingSpec& spec,
                          absl::Span<const float> timesteps,
                          absl::Span<uint8_t> out, bool out_pinned,
                          CallContext& context) {
    const bool repeat_only = spec.repeat_only;
    const bool fp64_math =
        !repeat_only && spec.precision == Precision::kFloat64;
    const absl::Span<const uint8_t> table =
        repeat_only || spec.half_dim() == 0
            ? absl::Span<const uint8_t>()
            : absl::MakeConstSpan(context.Frequencies(spec));
    const void* freqs = table.data();
    const size_t freq_bytes = table.size();
    // Device layout: [frequencies | timesteps | (256-aligned) output].  The
    // frequencies come first so the double table is naturally aligned; the
    // aligned output lets the kernel use vector stores.
    const size_t timesteps_offset = RoundUp(freq_bytes, 16);
    const size_t input_bytes =
        timesteps_offset + timesteps.size() * sizeof(float);
    const size_t out_offset = RoundUp(input_bytes, 256);
    const size_t out_bytes = out.size();
    RETURN_IF_ERROR(context.Reserve(
        out_offset + out_bytes,
        out_pinned ? input_bytes : std::max(input_bytes, out_bytes)));

    uint8_t* const host = context.host_buffer();
    uint8_t* const device = context.device_buffer();
    if (freq_bytes > 0) std::memcpy(host, freqs, freq_bytes);
    std::memcpy(host + timesteps_offset, timesteps.data(),
                timesteps.size() * sizeof(float));

    const cudaStream_t stream = context.stream();
    RETURN_IF_ERROR(Check(cudaMemcpyAsync(device, host, input_bytes,
                                          cudaMemcpyHostToDevice, stream),
                          "cudaMemcpyAsync (host to device)"));

    EmbedArgs args;
    args.timesteps = reinterpret_cast<const float*>(device + timesteps_offset);
    args.frequencies = freq_bytes > 0 ? device : nullptr;
    args.out = device + out_offset;
    args.rows = static_cast<int64_t>(timesteps.size());
    args.dim = spec.dim;
    args.time_factor = spec.time_factor;
    args.scale = spec.scale;
    args.flip_sin_to_cos = spec.flip_sin_to_cos;
    args.interleaved = spec.layout == Layout::kInterleaved;
    args.repeat_only = repeat_only;
    args.fp64_math = fp64_math;
    args.out_type = ToOutType(spec.dtype);
    RETURN_IF_ERROR(
        Check(LaunchEmbed(args, stream), "embedding kernel launch"));

    uint8_t* const landing = out_pinned ? out.data() : host;
    RETURN_IF_ERROR(
        Check(cudaMemcpyAsync(landing, device + out_offset, out_bytes,
                              cudaMemcpyDeviceToHost, stream),
              "cudaMemcpyAsync (device to host)"));
    RETURN_IF_ERROR(
        Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
    if (!out_pinned) std::memcpy(out.data(), host, out_bytes);
    return absl::OkStatus();
  }

  const int device_;
  const std::string description_;
  const std::shared_ptr<PinnedPool> pinned_;
  absl::Mutex mu_;
  // Contexts not in use; grows to the peak number of concurrent calls.
  std::vector<std::unique_ptr<CallContext>> idle_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device) {
  RETURN_IF_ERROR(Probe(device));
  cudaDeviceProp properties;
  const absl::Status status = Check(
      cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
  if (!status.ok()) return absl::FailedPreconditionError(status.message());
  std::string description = absl::StrCat(
      properties.name, " (sm_", properties.major, properties.minor, ")");
  return std::unique_ptr<Backend>(
      new CudaBackend(device, std::move(description)));
}

}  // namespace cuda
}  // namespace temb
