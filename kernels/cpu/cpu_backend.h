// The CPU backend: SLEEF-vectorised sin/cos with runtime ISA dispatch and
// threads for large batches.
#ifndef TEMB_KERNELS_CPU_CPU_BACKEND_H_
#define TEMB_KERNELS_CPU_CPU_BACKEND_H_

#include <memory>

#include "temb/kernels/backend.h"

namespace temb {

// `threads`: workers one large request may use (0 = hardware concurrency).
std::unique_ptr<Backend> CreateCpuBackend(int threads);

}  // namespace temb

#endif  // TEMB_KERNELS_CPU_CPU_BACKEND_H_
