// The registry must degrade gracefully: a binary with the CUDA backend built
// in starts and serves on a machine without a GPU (or without a driver), and
// uses the GPU when one works.  What the registry should pick is decided
// from outside the code under test: from the kernel driver's device nodes
// (and TEMB_REQUIRE_CUDA=1 on GPU machines), never from the registry's own
// probe, so a registry that ignored a working GPU, or picked a missing one,
// fails here.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
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

// Whether this machine has an NVIDIA GPU, as the kernel driver shows it.
bool SystemHasNvidiaGpu() {
  std::error_code error;
  return std::filesystem::exists("/dev/nvidia0", error);
}

bool CudaRequired() {
  const char* value = std::getenv("TEMB_REQUIRE_CUDA");
  return value != nullptr && std::string(value) == "1";
}

TEST(RegistryFallbackTest, AutoUsesCudaExactlyWhenAGpuIsThere) {
  const bool expect_cuda =
      CudaRequired() || (CudaBuiltIn() && SystemHasNvidiaGpu());
  if (CudaRequired()) {
    ASSERT_TRUE(CudaBuiltIn())
        << "TEMB_REQUIRE_CUDA=1 but CUDA is not built in";
  }
  absl::StatusOr<std::unique_ptr<Backend>> backend =
      CreateBackend(BackendChoice::kAuto);
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_EQ((*backend)->kind(),
            expect_cuda ? BackendKind::kCuda : BackendKind::kCpu)
      << (*backend)->device();
  EXPECT_EQ(CudaUsable(), expect_cuda);
}

TEST(RegistryFallbackTest, ExplicitCudaNeedsAUsableDevice) {
  absl::StatusOr<std::unique_ptr<Backend>> backend =
      CreateBackend(BackendChoice::kCuda);
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
  absl::StatusOr<std::unique_ptr<Backend>> cuda =
      CreateBackend(BackendChoice::kCuda, options);
  EXPECT_EQ(cuda.status().code(), absl::StatusCode::kFailedPrecondition)
      << cuda.status();
  absl::StatusOr<std::unique_ptr<Backend>> fallback =
      CreateBackend(BackendChoice::kAuto, options);
  ASSERT_TRUE(fallback.ok()) << fallback.status();
  EXPECT_EQ((*fallback)->kind(), BackendKind::kCpu);
}

// Whatever auto picked really computes: the LDM golden rows (float64 math,
// docs/semantics.md section 8) within the fp32 accuracy target
// 1e-6 + 5e-7 * |t|.
TEST(RegistryFallbackTest, AutoBackendComputesGoldenRows) {
  absl::StatusOr<std::unique_ptr<Backend>> backend =
      CreateBackend(BackendChoice::kAuto);
  ASSERT_TRUE(backend.ok()) << backend.status();
  EmbeddingSpec spec;
  spec.dim = 8;
  const std::vector<float> timesteps = {1.0f, 999.0f};
  const double golden[2][8] = {
      {0.540302306, 0.995004165, 0.99995, 0.9999995, 0.841470985, 0.0998334166,
       0.00999983333, 0.000999999833},
      {0.999649853, 0.807458658, -0.844469696, 0.541143507, -0.0264607527,
       -0.589924161, -0.535603335, 0.840930262},
  };
  std::vector<uint8_t> out(OutputBytes(spec, 2));
  ASSERT_TRUE((*backend)->Compute(spec, timesteps, absl::MakeSpan(out)).ok());
  for (int n = 0; n < 2; ++n) {
    for (int j = 0; j < 8; ++j) {
      float value;
      std::memcpy(&value, out.data() + (n * 8 + j) * sizeof(float),
                  sizeof value);
      EXPECT_NEAR(value, golden[n][j], 1e-6 + 5e-7 * timesteps[n])
          << (*backend)->device() << " row " << n << " col " << j;
    }
  }
}

}  // namespace
}  // namespace temb
