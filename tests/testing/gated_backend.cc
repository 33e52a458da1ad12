#include "temb/testing/gated_backend.h"

#include "temb/kernels/registry.h"

namespace temb::testing {

GatedBackend::GatedBackend() : inner_(*CreateBackend(BackendChoice::kCpu)) {}

absl::Status GatedBackend::Compute(const EmbeddingSpec& spec,
                                   absl::Span<const float> timesteps,
                                   absl::Span<uint8_t> out) {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    ++calls_;
    changed_.notify_all();
    changed_.wait(lock, [this] { return open_; });
  }
  return inner_->Compute(spec, timesteps, out);
}

void GatedBackend::Close() {
  std::lock_guard<std::mutex> lock(mutex_);
  open_ = false;
}

void GatedBackend::Open() {
  std::lock_guard<std::mutex> lock(mutex_);
  open_ = true;
  changed_.notify_all();
}

void GatedBackend::WaitForCalls(int n) {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return calls_ >= n; });
}

int GatedBackend::calls() {
  std::lock_guard<std::mutex> lock(mutex_);
  return calls_;
}

}  // namespace temb::testing
