// The bytes of a checkpoint tensor held for the model's lifetime.
//
// One step of a model streams every weight once (a Qwen-Image step reads
// 12.7 GiB), so the page size is part of the Linear's speed: in 4 KiB pages
// a 108 MiB weight is 27,648 TLB entries walked once each per step.  A
// buffer of 2 MiB or more is therefore allocated 2 MiB-aligned and marked
// MADV_HUGEPAGE before anything touches it, so that the read that fills it
// faults in transparent huge pages where the kernel allows them
// (transparent_hugepage "madvise" or "always"; elsewhere the hint is
// ignored and nothing else changes).  Measured on the 920 MiB Qwen-Image
// slice of docs/conditioning.md: one step 7-9% faster.
//
// Elements are default-initialised (not zeroed): every buffer is filled
// whole by a read or a conversion right after it is sized, and zeroing it
// first would touch every page twice.  A large buffer's memory is its size
// rounded up to a multiple of 2 MiB (docs/operations.md).
#ifndef TEMB_MODELS_WEIGHT_BYTES_H_
#define TEMB_MODELS_WEIGHT_BYTES_H_

#include <cstddef>
#include <cstdint>
#include <new>
#include <utility>
#include <vector>

namespace temb::models {

// The size from which a buffer is given huge pages, and their size.
inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// Allocates `bytes` (> 0) for a weight buffer: huge-page aligned and
// advised from kHugePageBytes up, plain operator new below.
void* AllocateWeightBytes(size_t bytes);
void FreeWeightBytes(void* pointer, size_t bytes) noexcept;

template <typename T>
struct WeightAllocator {
  using value_type = T;

  WeightAllocator() = default;
  template <typename U>
  WeightAllocator(const WeightAllocator<U>&) noexcept {}  // NOLINT

  T* allocate(size_t count) {
    return static_cast<T*>(AllocateWeightBytes(count * sizeof(T)));
  }
  void deallocate(T* pointer, size_t count) noexcept {
    FreeWeightBytes(pointer, count * sizeof(T));
  }
  // Sizing a vector leaves its elements uninitialised (see above).
  template <typename U>
  void construct(U* pointer) noexcept {
    ::new (static_cast<void*>(pointer)) U;
  }
  template <typename U, typename... Args>
  void construct(U* pointer, Args&&... args) {
    ::new (static_cast<void*>(pointer)) U(std::forward<Args>(args)...);
  }

  template <typename U>
  bool operator==(const WeightAllocator<U>&) const noexcept {
    return true;
  }
  template <typename U>
  bool operator!=(const WeightAllocator<U>&) const noexcept {
    return false;
  }
};

using WeightBytes = std::vector<uint8_t, WeightAllocator<uint8_t>>;

}  // namespace temb::models

#endif  // TEMB_MODELS_WEIGHT_BYTES_H_
