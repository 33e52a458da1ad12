// The registry's auto backend on a real GPU: the size router between the
// CPU and CUDA backends under many concurrent callers, and after fork().
//
// Each answer must equal, byte for byte, what the backend it is routed to
// computes alone (both are deterministic).  Without a usable device every
// test skips and says why (or fails, when TEMB_REQUIRE_CUDA is set).
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "temb/kernels/backend.h"
#include "temb/kernels/embedding_spec.h"
#include "temb/kernels/registry.h"

namespace temb {
namespace {

constexpr int kDim = 1280;
constexpr int64_t kThreshold = int64_t{1} << 20;  // bytes
constexpr int kSmallRows = 4;                     // 20 KiB: the CPU
constexpr int kLargeRows = 1024;                  // 5 MiB: the GPU

std::vector<float> Timesteps(int rows) {
  std::vector<float> t(rows);
  for (int n = 0; n < rows; ++n)
    t[n] = static_cast<float>((n * 37) % 1000) + 0.25f * (n % 4);
  return t;
}

class AutoBackendGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!CudaUsable()) {
      const std::string reason =
          std::string(CreateBackend(BackendChoice::kCuda).status().message());
      if (std::getenv("TEMB_REQUIRE_CUDA") != nullptr) {
        FAIL() << "TEMB_REQUIRE_CUDA is set but CUDA is not usable: " << reason;
      }
      GTEST_SKIP() << reason;
    }
    BackendOptions options;
    options.gpu_min_output_bytes = kThreshold;
    auto_ = Make(BackendChoice::kAuto, options);
    cpu_ = Make(BackendChoice::kCpu, options);
    cuda_ = Make(BackendChoice::kCuda, options);
    spec_.dim = kDim;
    small_t_ = Timesteps(kSmallRows);
    large_t_ = Timesteps(kLargeRows);
    small_on_cpu_ = Compute(*cpu_, small_t_);
    large_on_cuda_ = Compute(*cuda_, large_t_);
    large_on_cpu_ = Compute(*cpu_, large_t_);
  }

  static std::unique_ptr<Backend> Make(BackendChoice choice,
                                       const BackendOptions& options) {
    absl::StatusOr<std::unique_ptr<Backend>> backend =
        CreateBackend(choice, options);
    EXPECT_TRUE(backend.ok()) << backend.status();
    return backend.ok() ? std::move(*backend) : nullptr;
  }

  std::vector<uint8_t> Compute(Backend& backend,
                               const std::vector<float>& t) const {
    std::vector<uint8_t> out(OutputBytes(spec_, static_cast<int64_t>(t.size())),
                             0xab);
    const absl::Status status = backend.Compute(spec_, t, absl::MakeSpan(out));
    EXPECT_TRUE(status.ok()) << backend.device() << ": " << status;
    return out;
  }

  EmbeddingSpec spec_;
  std::unique_ptr<Backend> auto_, cpu_, cuda_;
  std::vector<float> small_t_, large_t_;
  std::vector<uint8_t> small_on_cpu_, large_on_cuda_, large_on_cpu_;
};

TEST_F(AutoBackendGpuTest, RoutesEachCallBySizeUnderConcurrentCallers) {
  ASSERT_EQ(auto_->kind(), BackendKind::kCuda) << auto_->device();
  ASSERT_EQ(auto_->KindFor(OutputBytes(spec_, kSmallRows)), BackendKind::kCpu);
  ASSERT_EQ(auto_->KindFor(OutputBytes(spec_, kLargeRows)), BackendKind::kCuda);
  // Routing shows in the bytes only where the two backends differ.
  RecordProperty("large_answer_differs_between_backends",
                 large_on_cpu_ != large_on_cuda_ ? "yes" : "no");
  std::atomic<int> wrong{0}, calls{0};
  const auto stop = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  std::vector<std::thread> callers;
  for (int c = 0; c < 16; ++c) {
    callers.emplace_back([&, c] {
      for (int n = c; std::chrono::steady_clock::now() < stop; ++n) {
        const bool large = n % 3 == 0;
        const std::vector<uint8_t> out =
            Compute(*auto_, large ? large_t_ : small_t_);
        if (out != (large ? large_on_cuda_ : small_on_cpu_)) ++wrong;
        ++calls;
      }
    });
  }
  for (std::thread& caller : callers) caller.join();
  EXPECT_EQ(wrong.load(), 0) << "of " << calls.load() << " calls";
  EXPECT_GT(calls.load(), 100);
}

// CUDA does not survive fork(): a child of a process that has used the GPU
// computes even large answers on the CPU, and the parent goes on on the GPU.
TEST_F(AutoBackendGpuTest, AForkedChildComputesOnTheCpu) {
  ASSERT_EQ(Compute(*auto_, large_t_), large_on_cuda_);
  const pid_t child = fork();
  ASSERT_NE(child, -1);
  if (child == 0) {
    const bool on_cpu =
        auto_->KindFor(OutputBytes(spec_, kLargeRows)) == BackendKind::kCpu &&
        Compute(*auto_, large_t_) == large_on_cpu_ &&
        Compute(*auto_, small_t_) == small_on_cpu_;
    _exit(on_cpu ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died: status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child did not compute on the CPU";
  EXPECT_EQ(Compute(*auto_, large_t_), large_on_cuda_);
  EXPECT_EQ(auto_->KindFor(OutputBytes(spec_, kLargeRows)), BackendKind::kCuda);
}

}  // namespace
}  // namespace temb
