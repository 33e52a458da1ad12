// The registry must degrade gracefully: a binary with the CUDA backend built
// in starts and serves on a machine without a GPU (or without a driver), and
// uses the GPU when one works.  Every assertion is conditional on
// CudaUsable(), so the suite holds on both kinds of machine.
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "temb/kernels/backend.h"
#include "temb/kernels/embedding_spec.h"
#include "temb/kernels/registry.h"

namespace temb {
namespace {

using ::testing::HasSubstr;

TEST(RegistryFallbackTest, AutoUsesCudaOnlyWhenUsable) {
  const bool usable = CudaUsable();
  EXPECT_EQ(CudaUsable(), usable) << "probing twice must give the same answer";
  if (!CudaBuiltIn()) {
    EXPECT_FALSE(usable) << "CUDA usable in a binary built without it";
  }
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend(BackendChoice::kAuto);
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_EQ((*backend)->kind(), usable ? BackendKind::kCuda : BackendKind::kCpu)
      << (*backend)->device();
}

TEST(RegistryFallbackTest, ExplicitCudaNeedsAUsableDevice) {
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend(BackendChoice::kCuda);
  if (CudaUsable()) {
    ASSERT_TRUE(backend.ok()) << backend.status();
    EXPECT_EQ((*backend)->kind(), BackendKind::kCuda);
  } else {
    EXPECT_EQ(backend.status().code(), absl::StatusCode::kFailedPrecondition)
        << backend.status();
    EXPECT_THAT(std::string(backend.status().message()),
                HasSubstr("no usable CUDA device"));
  }
}

TEST(RegistryFallbackTest, NonexistentDeviceFallsBackOrFails) {
  BackendOptions options;
  options.cuda_device = 4096;
  EXPECT_FALSE(CudaUsable(4096));
  EXPECT_FALSE(CudaUsable(-1));
  absl::StatusOr<std::unique_ptr<Backend>> cuda = CreateBackend(BackendChoice::kCuda, options);
  EXPECT_EQ(cuda.status().code(), absl::StatusCode::kFailedPrecondition) << cuda.status();
  absl::StatusOr<std::unique_ptr<Backend>> fallback =
      CreateBackend(BackendChoice::kAuto, options);
  ASSERT_TRUE(fallback.ok()) << fallback.status();
  EXPECT_EQ((*fallback)->kind(), BackendKind::kCpu);
}

// Whatever auto picked really computes: the LDM golden rows (float64 math,
// docs/semantics) within the fp32 accuracy target 1e-6 + 5e-7 * |t|.
TEST(RegistryFallbackTest, AutoBackendComputesGoldenRows) {
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend(BackendChoice::kAuto);
  ASSERT_TRUE(backend.ok()) << backend.status();
  EmbeddingSpec spec;
  spec.dim = 8;
  const std::vector<float> timesteps = {1.0f, 999.0f};
  const double golden[2][8] = {
      {0.540302306, 0.995004165, 0.99995, 0.9999995, 0.841470985, 0.0998334166,
       0.00999983333, 0.000999999833},
      {0.999649853, 0.807458658, -0.844469696, 0.541143507, -0.0264607527, -0.589924161,
       -0.535603335, 0.840930262},
  };
  std::vector<uint8_t> out(OutputBytes(spec, 2));
  ASSERT_TRUE((*backend)->Compute(spec, timesteps, absl::MakeSpan(out)).ok());
  for (int n = 0; n < 2; ++n) {
    for (int j = 0; j < 8; ++j) {
      float value;
      std::memcpy(&value, out.data() + (n * 8 + j) * sizeof(float), sizeof value);
      EXPECT_NEAR(value, golden[n][j], 1e-6 + 5e-7 * timesteps[n])
          << (*backend)->device() << " row " << n << " col " << j;
    }
  }
}

}  // namespace
}  // namespace temb
