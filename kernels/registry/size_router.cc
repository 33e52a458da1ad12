#include "temb/kernels/size_router.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace temb {
namespace {

class SizeRouter final : public Backend {
 public:
  SizeRouter(std::unique_ptr<Backend> small, std::unique_ptr<Backend> large,
             int64_t large_min_bytes)
      : small_(std::move(small)),
        large_(std::move(large)),
        large_min_bytes_(large_min_bytes) {}

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
    return output_bytes >= large_min_bytes_ ? *large_ : *small_;
  }

  const std::unique_ptr<Backend> small_;
  const std::unique_ptr<Backend> large_;
  const int64_t large_min_bytes_;
};

}  // namespace

std::unique_ptr<Backend> RouteBySize(std::unique_ptr<Backend> small,
                                     std::unique_ptr<Backend> large,
                                     int64_t large_min_bytes) {
  return std::make_unique<SizeRouter>(std::move(small), std::move(large),
                                      large_min_bytes);
}

}  // namespace temb
