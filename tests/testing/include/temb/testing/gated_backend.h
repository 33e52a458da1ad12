// GatedBackend: the real CPU backend behind a gate that can hold
// computations in flight, for tests of what a server does while it
// computes (drain, deadlines, admission).
#ifndef TEMB_TESTING_GATED_BACKEND_H_
#define TEMB_TESTING_GATED_BACKEND_H_

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "temb/kernels/backend.h"
#include "temb/kernels/embedding_spec.h"

namespace temb::testing {

// The real CPU backend, counting calls; Close() holds computations until
// Open().  Thread-safe.
class GatedBackend final : public Backend {
 public:
  GatedBackend();
  BackendKind kind() const override { return inner_->kind(); }
  std::string device() const override { return inner_->device(); }
  absl::Status Compute(const EmbeddingSpec& spec,
                       absl::Span<const float> timesteps,
                       absl::Span<uint8_t> out) override;

  void Close();
  void Open();
  // Waits until `n` computations have reached the backend (held or not).
  void WaitForCalls(int n);
  int calls();

 private:
  std::unique_ptr<Backend> inner_;
  std::mutex mutex_;
  std::condition_variable changed_;
  bool open_ = true;
  int calls_ = 0;
};

}  // namespace temb::testing

#endif  // TEMB_TESTING_GATED_BACKEND_H_
