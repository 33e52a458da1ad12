// The size router sends each request by its output size and says which
// backend computed it; results are those of the backend it picked.
#include "temb/kernels/size_router.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "temb/kernels/backend.h"
#include "temb/kernels/embedding_spec.h"

namespace temb {
namespace {

// Fills the output with its own mark and counts its calls.
class MarkingBackend final : public Backend {
 public:
  MarkingBackend(BackendKind kind, uint8_t mark, int* calls)
      : kind_(kind), mark_(mark), calls_(calls) {}
  BackendKind kind() const override { return kind_; }
  std::string device() const override {
    return kind_ == BackendKind::kCuda ? "gpu0" : "cpu0";
  }
  absl::Status Compute(const EmbeddingSpec&, absl::Span<const float>,
                       absl::Span<uint8_t> out) override {
    ++*calls_;
    for (uint8_t& byte : out) byte = mark_;
    return absl::OkStatus();
  }

 private:
  BackendKind kind_;
  uint8_t mark_;
  int* calls_;
};

class SizeRouterTest : public ::testing::Test {
 protected:
  // 320 fp32 columns: 1280 bytes per row, so the 4096-byte threshold lies
  // between 3 rows (3840 bytes) and 4 rows (5120 bytes).
  static constexpr int64_t kThreshold = 4096;

  void SetUp() override {
    router_ = RouteBySize(std::make_unique<MarkingBackend>(BackendKind::kCpu,
                                                           0x11, &small_calls_),
                          std::make_unique<MarkingBackend>(BackendKind::kCuda,
                                                           0x22, &large_calls_),
                          kThreshold);
    spec_.dim = 320;
  }

  uint8_t ComputeRows(int rows) {
    std::vector<float> t(rows, 1.0f);
    std::vector<uint8_t> out(OutputBytes(spec_, rows));
    EXPECT_TRUE(router_->Compute(spec_, t, absl::MakeSpan(out)).ok());
    return out.empty() ? 0 : out.front();
  }

  int small_calls_ = 0;
  int large_calls_ = 0;
  std::unique_ptr<Backend> router_;
  EmbeddingSpec spec_;
};

TEST_F(SizeRouterTest, SmallOutputsGoToTheSmallBackend) {
  EXPECT_EQ(ComputeRows(1), 0x11);
  EXPECT_EQ(ComputeRows(3), 0x11);
  EXPECT_EQ(small_calls_, 2);
  EXPECT_EQ(large_calls_, 0);
}

TEST_F(SizeRouterTest, OutputsAtOrAboveTheThresholdGoToTheLargeBackend) {
  EXPECT_EQ(ComputeRows(4), 0x22);
  EXPECT_EQ(ComputeRows(1000), 0x22);
  EXPECT_EQ(small_calls_, 0);
  EXPECT_EQ(large_calls_, 2);
}

TEST_F(SizeRouterTest, KindForNamesTheBackendThatComputes) {
  EXPECT_EQ(router_->KindFor(0), BackendKind::kCpu);
  EXPECT_EQ(router_->KindFor(kThreshold - 1), BackendKind::kCpu);
  EXPECT_EQ(router_->KindFor(kThreshold), BackendKind::kCuda);
  EXPECT_EQ(router_->KindFor(int64_t{1} << 30), BackendKind::kCuda);
}

TEST_F(SizeRouterTest, DescribesBothDevicesAndServesAsTheLargeOne) {
  EXPECT_EQ(router_->kind(), BackendKind::kCuda);
  EXPECT_EQ(router_->device(), "gpu0; outputs under 4096 bytes on cpu: cpu0");
}

// CUDA does not survive fork(): a child of the process that made the
// router computes everything on the small backend (the CPU); the parent
// goes on as before.
TEST_F(SizeRouterTest, AForkedChildUsesOnlyTheSmallBackend) {
  EXPECT_EQ(ComputeRows(1000), 0x22);
  const pid_t child = fork();
  ASSERT_NE(child, -1);
  if (child == 0) {
    const bool small_only =
        ComputeRows(1000) == 0x11 &&
        router_->KindFor(int64_t{1} << 30) == BackendKind::kCpu &&
        large_calls_ == 1;
    _exit(small_only ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child used the large backend";
  EXPECT_EQ(ComputeRows(1000), 0x22);
  EXPECT_EQ(router_->KindFor(int64_t{1} << 30), BackendKind::kCuda);
}

}  // namespace
}  // namespace temb
