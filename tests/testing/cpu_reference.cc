#include "temb/testing/cpu_reference.h"

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "temb/kernels/backend.h"
#include "temb/kernels/registry.h"

namespace temb::testing {

std::string CpuBackendBytes(const EmbeddingSpec& spec,
                            const std::vector<float>& timesteps) {
  auto backend = *CreateBackend(BackendChoice::kCpu);
  std::string out(static_cast<size_t>(OutputBytes(spec, timesteps.size())),
                  '\0');
  const absl::Status status = backend->Compute(
      spec, timesteps,
      absl::MakeSpan(reinterpret_cast<uint8_t*>(out.data()), out.size()));
  EXPECT_TRUE(status.ok()) << status;
  if (!status.ok()) out.clear();
  return out;
}

}  // namespace temb::testing
