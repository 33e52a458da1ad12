// Page-locked host memory lent as response buffers.  Private to kernels/cuda.
#ifndef TEMB_KERNELS_CUDA_PINNED_POOL_H_
#define TEMB_KERNELS_CUDA_PINNED_POOL_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "temb/kernels/backend.h"

namespace temb {
namespace cuda {

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
    Buffer(std::shared_ptr<PinnedPool> pool, uint8_t* data, size_t size,
           size_t capacity)
        : pool_(std::move(pool)),
          data_(data),
          size_(size),
          capacity_(capacity) {}
    ~Buffer() override { pool_->Return(data_, capacity_); }
    absl::Span<uint8_t> bytes() override {
      return absl::MakeSpan(data_, size_);
    }

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
  std::map<size_t, std::vector<uint8_t*>> free_
      ABSL_GUARDED_BY(mu_);  // by capacity
  absl::flat_hash_map<const uint8_t*, size_t> lent_
      ABSL_GUARDED_BY(mu_);                     // -> capacity
  size_t held_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // lent and kept
};

}  // namespace cuda
}  // namespace temb

#endif  // TEMB_KERNELS_CUDA_PINNED_POOL_H_
