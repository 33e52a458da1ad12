// EmbedService: the service core shared by every frontend (native temb.v1,
// KServe v2) and by the CLI's in-process mode.  It resolves presets, validates
// once, enforces limits and runs the backend.  No gRPC types here: frontends
// convert their messages to SpecRequest and back, and account metrics and
// request logs through RequestObserver (request_observer.h).
#ifndef TEMB_SERVER_CORE_EMBED_SERVICE_H_
#define TEMB_SERVER_CORE_EMBED_SERVICE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/core/presets.h"
#include "temb/kernels/backend.h"
#include "temb/kernels/embedding_spec.h"

namespace temb {

// What a caller asks for: a preset and/or explicit fields.  Unset fields take
// the preset's value; without a preset, dim, flip_sin_to_cos and
// downscale_freq_shift are required and the rest default as in EmbeddingSpec.
// With a preset only dim (where the preset allows it), precision and dtype may
// be set.
struct SpecRequest {
  std::string preset;  // empty: explicit spec
  std::optional<int> dim;
  std::optional<double> max_period;
  std::optional<bool> flip_sin_to_cos;
  std::optional<double> downscale_freq_shift;
  std::optional<double> scale;
  std::optional<double> time_factor;
  std::optional<bool> repeat_only;
  std::optional<Layout> layout;
  std::optional<Precision> precision;
  std::optional<DType> dtype;
};

// Turns a SpecRequest into a validated EmbeddingSpec.  NOT_FOUND for an
// unknown preset; INVALID_ARGUMENT naming the field otherwise;
// RESOURCE_EXHAUSTED for dim above limits.max_dim.
absl::StatusOr<EmbeddingSpec> ResolveSpec(const SpecRequest& request,
                                          const PresetCatalog& presets,
                                          const Limits& limits);

// A computed embedding: `rows` x spec.dim elements of spec.dtype, row-major,
// little-endian, in `data` (a std::string so that frontends can move it into a
// protobuf bytes field without copying).
struct Embedding {
  EmbeddingSpec spec;
  int64_t rows = 0;
  std::string data;
  BackendKind backend = BackendKind::kCpu;
};

class EmbedService {
 public:
  struct Options {
    Limits limits;
  };

  EmbedService(std::unique_ptr<Backend> backend, PresetCatalog presets,
               Options options);

  // Thread-safe.  Validates the whole request before any work.
  absl::StatusOr<Embedding> Embed(const SpecRequest& request,
                                  absl::Span<const float> timesteps) const;

  const Backend& backend() const { return *backend_; }
  const PresetCatalog& presets() const { return presets_; }
  const Limits& limits() const { return options_.limits; }

 private:
  std::unique_ptr<Backend> backend_;
  PresetCatalog presets_;
  Options options_;
};

}  // namespace temb

#endif  // TEMB_SERVER_CORE_EMBED_SERVICE_H_
