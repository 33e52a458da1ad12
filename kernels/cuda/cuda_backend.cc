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
// Every CUDA error becomes an absl::Status here, at the first host boundary.
#include "cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cuda/embed_kernel.cuh"
#include "temb/kernels/frequencies.h"
#include "temb/kernels/status_macros.h"

namespace temb {
namespace cuda {
namespace {

// Errors that describe the device or its resources rather than a bug: a
// retry elsewhere (or later) may succeed.
bool IsUnavailable(cudaError_t error) {
  switch (error) {
    case cudaErrorMemoryAllocation:
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorDeviceUninitialized:
    case cudaErrorLaunchOutOfResources:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
    case cudaErrorSystemNotReady:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCudartUnloading:
      return true;
    default:
      return false;
  }
}

std::string DescribeError(cudaError_t error) {
  return absl::StrCat(cudaGetErrorName(error), " (", cudaGetErrorString(error), ")");
}

// OK, or UNAVAILABLE / INTERNAL naming the operation and the CUDA error.
absl::Status Check(cudaError_t error, absl::string_view operation) {
  if (error == cudaSuccess) return absl::OkStatus();
  // Reset the thread's last-error slot so a later, unrelated check does not
  // report this error a second time (sticky errors stay regardless).
  (void)cudaGetLastError();
  std::string message = absl::StrCat("CUDA ", operation, " failed: ", DescribeError(error));
  return IsUnavailable(error) ? absl::UnavailableError(message)
                              : absl::InternalError(message);
}

size_t RoundUp(size_t value, size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// Capacity for `needed` bytes: at least double the old one, so a growing
// workload reallocates O(log size) times.
size_t GrownCapacity(size_t current, size_t needed) {
  constexpr size_t kMinCapacity = size_t{64} << 10;
  return std::max({needed, 2 * current, kMinCapacity});
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

// Restores the calling thread's current device on scope exit.
class ScopedDevice {
 public:
  ScopedDevice() {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      (void)cudaGetLastError();
      previous_ = -1;
    }
  }
  ~ScopedDevice() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

 private:
  int previous_ = -1;
};

struct DeviceFree {
  void operator()(void* p) const { (void)cudaFree(p); }
};

absl::Status RunProbeKernel(int device) {
  ScopedDevice restore;
  RETURN_IF_ERROR(Check(cudaSetDevice(device), "cudaSetDevice"));
  void* raw = nullptr;
  RETURN_IF_ERROR(Check(cudaMalloc(&raw, kProbeValues * sizeof(int)), "cudaMalloc"));
  std::unique_ptr<void, DeviceFree> buffer(raw);
  constexpr int kSeed = 0x2a17;
  int* values = static_cast<int*>(raw);
  RETURN_IF_ERROR(Check(LaunchProbe(values, kSeed, nullptr), "probe kernel launch"));
  int host[kProbeValues] = {};
  RETURN_IF_ERROR(Check(cudaMemcpy(host, values, sizeof host, cudaMemcpyDeviceToHost),
                        "cudaMemcpy"));
  for (int i = 0; i < kProbeValues; ++i) {
    if (host[i] != ProbeValue(kSeed, i)) {
      return absl::InternalError(absl::StrCat("probe kernel wrote ", host[i], " at ", i,
                                              ", expected ", ProbeValue(kSeed, i)));
    }
  }
  return absl::OkStatus();
}

// Page-locked host buffers lent as outputs.  cudaMallocHost costs
// milliseconds for a few MiB (it pins every page), so buffers that come back
// are kept for reuse, by power-of-two capacity.  All of them together, lent
// and kept, stay within kBudgetBytes: past it a cached buffer of another size
// is freed to make room, and when nothing can be freed Lend() says no and
// the call uses ordinary memory.  The budget is the server's default
// --max_queued_bytes (512 MiB), which already bounds the response bytes held
// at once, so a larger one would rarely be used.
class PinnedPool : public std::enable_shared_from_this<PinnedPool> {
 public:
  static constexpr size_t kMinCapacity = size_t{64} << 10;
  static constexpr size_t kBudgetBytes = size_t{512} << 20;

  ~PinnedPool() {
    for (auto& [capacity, buffers] : free_) {
      for (uint8_t* buffer : buffers) (void)cudaFreeHost(buffer);
    }
    (void)cudaGetLastError();
  }

  // nullptr when the budget is spent or page-locked memory cannot be had.
  std::unique_ptr<HostBuffer> Lend(size_t bytes) {
    size_t capacity = kMinCapacity;
    while (capacity < bytes) capacity *= 2;
    uint8_t* data = nullptr;
    std::vector<uint8_t*> evicted;
    {
      absl::MutexLock lock(&mu_);
      auto it = free_.find(capacity);
      if (it != free_.end() && !it->second.empty()) {
        data = it->second.back();
        it->second.pop_back();
      } else {
        // Make room by freeing kept buffers of other sizes, largest first.
        while (held_bytes_ + capacity > kBudgetBytes && !free_.empty()) {
          auto largest = std::prev(free_.end());
          if (largest->second.empty()) {
            free_.erase(largest);
            continue;
          }
          evicted.push_back(largest->second.back());
          largest->second.pop_back();
          held_bytes_ -= largest->first;
        }
        if (held_bytes_ + capacity > kBudgetBytes) {
          FreeAll(evicted);
          return nullptr;
        }
        held_bytes_ += capacity;  // reserved before the slow allocation
      }
    }
    FreeAll(evicted);
    if (data == nullptr) {
      void* raw = nullptr;
      if (cudaMallocHost(&raw, capacity) != cudaSuccess) {
        (void)cudaGetLastError();
        absl::MutexLock lock(&mu_);
        held_bytes_ -= capacity;
        return nullptr;
      }
      data = static_cast<uint8_t*>(raw);
    }
    absl::MutexLock lock(&mu_);
    lent_[data] = capacity;
    return std::make_unique<Buffer>(shared_from_this(), data, bytes, capacity);
  }

  // Whether `out` starts a buffer this pool lent and fits in it.
  bool IsLent(absl::Span<const uint8_t> out) {
    absl::MutexLock lock(&mu_);
    auto it = lent_.find(out.data());
    return it != lent_.end() && out.size() <= it->second;
  }

 private:
  class Buffer final : public HostBuffer {
   public:
    Buffer(std::shared_ptr<PinnedPool> pool, uint8_t* data, size_t size, size_t capacity)
        : pool_(std::move(pool)), data_(data), size_(size), capacity_(capacity) {}
    ~Buffer() override { pool_->Return(data_, capacity_); }
    absl::Span<uint8_t> bytes() override { return absl::MakeSpan(data_, size_); }

   private:
    // Keeps the pool alive for as long as any buffer it lent.
    const std::shared_ptr<PinnedPool> pool_;
    uint8_t* const data_;
    const size_t size_;
    const size_t capacity_;
  };

  static void FreeAll(const std::vector<uint8_t*>& buffers) {
    for (uint8_t* buffer : buffers) (void)cudaFreeHost(buffer);
    if (!buffers.empty()) (void)cudaGetLastError();
  }

  void Return(uint8_t* data, size_t capacity) {
    absl::MutexLock lock(&mu_);
    lent_.erase(data);
    free_[capacity].push_back(data);  // still counted in held_bytes_
  }

  absl::Mutex mu_;
  std::map<size_t, std::vector<uint8_t*>> free_ ABSL_GUARDED_BY(mu_);  // by capacity
  absl::flat_hash_map<const uint8_t*, size_t> lent_ ABSL_GUARDED_BY(mu_);  // -> capacity
  size_t held_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // lent and kept
};

// Per-call resources.  Used by one call at a time.
class CallContext {
 public:
  static absl::StatusOr<std::unique_ptr<CallContext>> Create() {
    auto context = std::unique_ptr<CallContext>(new CallContext());
    RETURN_IF_ERROR(Check(cudaStreamCreateWithFlags(&context->stream_, cudaStreamNonBlocking),
                          "cudaStreamCreateWithFlags"));
    return context;
  }

  ~CallContext() {
    // Errors are ignored: this runs on error paths and at process exit,
    // when the runtime may already be shutting down.
    if (stream_ != nullptr) {
      (void)cudaStreamSynchronize(stream_);
      (void)cudaStreamDestroy(stream_);
    }
    if (device_ != nullptr) (void)cudaFree(device_);
    if (host_ != nullptr) (void)cudaFreeHost(host_);
    (void)cudaGetLastError();
  }

  CallContext(const CallContext&) = delete;
  CallContext& operator=(const CallContext&) = delete;

  // Ensures at least the given capacities; contents are not preserved.
  // Only called between calls, when the stream is idle.
  absl::Status Reserve(size_t device_bytes, size_t host_bytes) {
    if (device_bytes > device_capacity_) {
      const size_t capacity = GrownCapacity(device_capacity_, device_bytes);
      void* old = std::exchange(device_, nullptr);
      device_capacity_ = 0;
      if (old != nullptr) RETURN_IF_ERROR(Check(cudaFree(old), "cudaFree"));
      RETURN_IF_ERROR(Check(cudaMalloc(&device_, capacity), "cudaMalloc"));
      device_capacity_ = capacity;
    }
    if (host_bytes > host_capacity_) {
      const size_t capacity = GrownCapacity(host_capacity_, host_bytes);
      void* old = std::exchange(host_, nullptr);
      host_capacity_ = 0;
      if (old != nullptr) RETURN_IF_ERROR(Check(cudaFreeHost(old), "cudaFreeHost"));
      RETURN_IF_ERROR(Check(cudaMallocHost(&host_, capacity), "cudaMallocHost"));
      host_capacity_ = capacity;
    }
    return absl::OkStatus();
  }

  // The frequency table of `spec` as bytes (float, or double for fp64
  // precision).  The last one is kept (FrequencyKey says why).
  const std::vector<uint8_t>& Frequencies(const EmbeddingSpec& spec) {
    const FrequencyKey key = FrequencyKey::Of(spec);
    if (table_valid_ && table_key_ == key) return table_;
    table_valid_ = false;
    if (key.precision == Precision::kFloat64) {
      const std::vector<double> values = Float64Frequencies(spec);
      table_.assign(reinterpret_cast<const uint8_t*>(values.data()),
                    reinterpret_cast<const uint8_t*>(values.data() + values.size()));
    } else {
      const std::vector<float> values = Float32Frequencies(spec);
      table_.assign(reinterpret_cast<const uint8_t*>(values.data()),
                    reinterpret_cast<const uint8_t*>(values.data() + values.size()));
    }
    table_key_ = key;
    table_valid_ = true;
    return table_;
  }

  cudaStream_t stream() const { return stream_; }
  uint8_t* device_buffer() const { return static_cast<uint8_t*>(device_); }
  uint8_t* host_buffer() const { return static_cast<uint8_t*>(host_); }

 private:
  CallContext() = default;

  cudaStream_t stream_ = nullptr;
  void* device_ = nullptr;
  size_t device_capacity_ = 0;
  void* host_ = nullptr;  // pinned
  size_t host_capacity_ = 0;
  // The last frequency table and its key.
  std::vector<uint8_t> table_;
  bool table_valid_ = false;
  FrequencyKey table_key_;
};

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

  absl::Status Compute(const EmbeddingSpec& spec, absl::Span<const float> timesteps,
                       absl::Span<uint8_t> out) override {
    const int64_t expected = OutputBytes(spec, static_cast<int64_t>(timesteps.size()));
    if (static_cast<int64_t>(out.size()) != expected) {
      // Cheap to check, and the kernel would otherwise write past the buffer.
      return absl::InvalidArgumentError(absl::StrCat(
          "output buffer has ", out.size(), " bytes, the result needs ", expected));
    }
    if (timesteps.empty()) return absl::OkStatus();
    // The current device is per thread and callers' threads are arbitrary.
    RETURN_IF_ERROR(Check(cudaSetDevice(device_), "cudaSetDevice"));
    ASSIGN_OR_RETURN(std::unique_ptr<CallContext> context, Acquire());
    absl::Status status = Run(spec, timesteps, out, pinned_->IsLent(out), *context);
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
  static absl::Status Run(const EmbeddingSpec& spec, absl::Span<const float> timesteps,
                          absl::Span<uint8_t> out, bool out_pinned, CallContext& context) {
    const bool repeat_only = spec.repeat_only;
    const bool fp64_math = !repeat_only && spec.precision == Precision::kFloat64;
    const absl::Span<const uint8_t> table = repeat_only || spec.half_dim() == 0
                                                ? absl::Span<const uint8_t>()
                                                : absl::MakeConstSpan(context.Frequencies(spec));
    const void* freqs = table.data();
    const size_t freq_bytes = table.size();
    // Device layout: [frequencies | timesteps | (256-aligned) output].  The
    // frequencies come first so the double table is naturally aligned; the
    // aligned output lets the kernel use vector stores.
    const size_t timesteps_offset = RoundUp(freq_bytes, 16);
    const size_t input_bytes = timesteps_offset + timesteps.size() * sizeof(float);
    const size_t out_offset = RoundUp(input_bytes, 256);
    const size_t out_bytes = out.size();
    RETURN_IF_ERROR(context.Reserve(out_offset + out_bytes,
                                    out_pinned ? input_bytes : std::max(input_bytes, out_bytes)));

    uint8_t* const host = context.host_buffer();
    uint8_t* const device = context.device_buffer();
    if (freq_bytes > 0) std::memcpy(host, freqs, freq_bytes);
    std::memcpy(host + timesteps_offset, timesteps.data(), timesteps.size() * sizeof(float));

    const cudaStream_t stream = context.stream();
    RETURN_IF_ERROR(Check(
        cudaMemcpyAsync(device, host, input_bytes, cudaMemcpyHostToDevice, stream),
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
    RETURN_IF_ERROR(Check(LaunchEmbed(args, stream), "embedding kernel launch"));

    uint8_t* const landing = out_pinned ? out.data() : host;
    RETURN_IF_ERROR(Check(
        cudaMemcpyAsync(landing, device + out_offset, out_bytes, cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync (device to host)"));
    RETURN_IF_ERROR(Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
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

absl::Status Probe(int device) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    // Without a driver this is cudaErrorInsufficientDriver, not
    // cudaErrorNoDevice; either way there is nothing to run on.
    (void)cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("cudaGetDeviceCount failed: ", DescribeError(error),
                     "; is an NVIDIA GPU with a recent enough driver present?"));
  }
  if (count <= 0) return absl::FailedPreconditionError("no CUDA device found");
  if (device < 0 || device >= count) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CUDA device ", device, " does not exist (", count, " device(s) found)"));
  }
  const absl::Status probe = RunProbeKernel(device);
  if (!probe.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "probe kernel failed on CUDA device ", device, ": ", probe.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device) {
  RETURN_IF_ERROR(Probe(device));
  cudaDeviceProp properties;
  const absl::Status status =
      Check(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
  if (!status.ok()) return absl::FailedPreconditionError(status.message());
  std::string description = absl::StrCat(properties.name, " (sm_", properties.major,
                                         properties.minor, ")");
  return std::unique_ptr<Backend>(new CudaBackend(device, std::move(description)));
}

}  // namespace cuda
}  // namespace temb
