// What the CPU backend computes, as the bytes a server should answer with.
#ifndef TEMB_TESTING_CPU_REFERENCE_H_
#define TEMB_TESTING_CPU_REFERENCE_H_

#include <string>
#include <vector>

#include "temb/kernels/embedding_spec.h"

namespace temb::testing {

// The output bytes of a direct CPU backend computation of `timesteps` under
// `spec`; a failed computation is a test failure (and empty bytes).
std::string CpuBackendBytes(const EmbeddingSpec& spec,
                            const std::vector<float>& timesteps);

}  // namespace temb::testing

#endif  // TEMB_TESTING_CPU_REFERENCE_H_
