// The per-call CUDA resources of the backend.  Private to kernels/cuda.
#ifndef TEMB_KERNELS_CUDA_CALL_CONTEXT_H_
#define TEMB_KERNELS_CUDA_CALL_CONTEXT_H_

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "cuda_status.h"
#include "temb/base/status_macros.h"
#include "temb/kernels/embedding_spec.h"
#include "temb/kernels/frequencies.h"

namespace temb {
namespace cuda {

// Capacity for `needed` bytes: at least double the old one, so a growing
// workload reallocates O(log size) times.
inline size_t GrownCapacity(size_t current, size_t needed) {
  constexpr size_t kMinCapacity = size_t{64} << 10;
  return std::max({needed, 2 * current, kMinCapacity});
}

// Per-call resources.  Used by one call at a time.
class CallContext {
 public:
  static absl::StatusOr<std::unique_ptr<CallContext>> Create() {
    auto context = std::unique_ptr<CallContext>(new CallContext());
    RETURN_IF_ERROR(Check(
        cudaStreamCreateWithFlags(&context->stream_, cudaStreamNonBlocking),
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
      if (old != nullptr)
        RETURN_IF_ERROR(Check(cudaFreeHost(old), "cudaFreeHost"));
      RETURN_IF_ERROR(
          Check(cudaMallocHost(&host_, capacity), "cudaMallocHost"));
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
      table_.assign(
          reinterpret_cast<const uint8_t*>(values.data()),
          reinterpret_cast<const uint8_t*>(values.data() + values.size()));
    } else {
      const std::vector<float> values = Float32Frequencies(spec);
      table_.assign(
          reinterpret_cast<const uint8_t*>(values.data()),
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

}  // namespace cuda
}  // namespace temb

#endif  // TEMB_KERNELS_CUDA_CALL_CONTEXT_H_
