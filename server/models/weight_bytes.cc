#include "temb/models/weight_bytes.h"

#include <sys/mman.h>

#include <cstdlib>
#include <new>

namespace temb::models {

void* AllocateWeightBytes(size_t bytes) {
  if (bytes < kHugePageBytes) return ::operator new(bytes);
  const size_t rounded =
      (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  void* pointer = std::aligned_alloc(kHugePageBytes, rounded);
  if (pointer == nullptr) throw std::bad_alloc();
  // A hint only: where the kernel declines it the buffer is plain memory.
  (void)::madvise(pointer, rounded, MADV_HUGEPAGE);
  return pointer;
}

void FreeWeightBytes(void* pointer, size_t bytes) noexcept {
  if (bytes < kHugePageBytes) {
    ::operator delete(pointer);
  } else {
    std::free(pointer);
  }
}

}  // namespace temb::models
