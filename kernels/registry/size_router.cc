#include "temb/kernels/size_router.h"

#include <pthread.h>

#include <atomic>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace temb {
namespace {

// How many fork()s separate this process from the one that made the first
// router.  CUDA does not survive fork(): in a child of the process that
// made a router (a data-loader worker forked from a pipeline computing in
// process), the router sends everything to its small backend, the CPU.
std::atomic<int> forks_since_first_router{0};

void NoteForkInChild() {
  forks_since_first_router.fetch_add(1, std::memory_order_relaxed);
}

int ForksNow() {
  static const bool registered =
      pthread_atfork(nullptr, nullptr, NoteForkInChild) == 0;
  (void)registered;
  return forks_since_first_router.load(std::memory_order_relaxed);
}

class SizeRouter final : public Backend {
 public:
  SizeRouter(std::unique_ptr<Backend> small, std::unique_ptr<Backend> large,
             int64_t large_min_bytes)
      : small_(std::move(small)),
        large_(std::move(large)),
        large_min_bytes_(large_min_bytes),
        created_after_forks_(ForksNow()) {}

  BackendKind kind() const override { return large_->kind(); }

  std::string device() const override {
    return absl::StrCat(large_->device(), "; outputs under ", large_min_bytes_,
                        " bytes on ", BackendKindName(small_->kind()), ": ",
                        small_->device());
  }

  BackendKind KindFor(int64_t output_bytes) const override {
    return Pick(output_bytes).kind();
  }

  std::unique_ptr<HostBuffer> AllocateOutput(size_t bytes) override {
    return Pick(static_cast<int64_t>(bytes)).AllocateOutput(bytes);
  }

  absl::Status Compute(const EmbeddingSpec& spec,
                       absl::Span<const float> timesteps,
                       absl::Span<uint8_t> out) override {
    return Pick(static_cast<int64_t>(out.size())).Compute(spec, timesteps, out);
  }

 private:
  Backend& Pick(int64_t output_bytes) const {
    const bool forked = forks_since_first_router.load(
                            std::memory_order_relaxed) != created_after_forks_;
    return output_bytes >= large_min_bytes_ && !forked ? *large_ : *small_;
  }

  const std::unique_ptr<Backend> small_;
  const std::unique_ptr<Backend> large_;
  const int64_t large_min_bytes_;
  const int created_after_forks_;
};

}  // namespace

std::unique_ptr<Backend> RouteBySize(std::unique_ptr<Backend> small,
                                     std::unique_ptr<Backend> large,
                                     int64_t large_min_bytes) {
  return std::make_unique<SizeRouter>(std::move(small), std::move(large),
                                      large_min_bytes);
}

}  // namespace temb
