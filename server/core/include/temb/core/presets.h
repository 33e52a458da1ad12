// Named embedding conventions per model family ("sd15", "sdxl", "flux", ...).
//
// The catalogue is plain data here; where it comes from (the built-in text
// proto, a user's file) is the v1_convert layer's business
// (temb/v1_convert/preset_catalog.h).
#ifndef TEMB_CORE_PRESETS_H_
#define TEMB_CORE_PRESETS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "temb/kernels/embedding_spec.h"

namespace temb {

// One embedding a model's denoising step needs, computed with `preset`.
struct PresetPart {
  std::string name;    // e.g. "timestep", "guidance", "add_time"
  std::string preset;  // a preset of the same catalogue
};

struct Preset {
  std::string name;
  std::string description;
  // The fixed convention; spec.dim is the default width and spec.dtype the
  // default output dtype.  spec.dim is 0 only for a dim_overridable preset
  // without a default width (e.g. "ldm"): callers must then choose dim.
  EmbeddingSpec spec;
  // Whether callers may choose dim (e.g. "transformer", "ldm").
  bool dim_overridable = false;
  // The embeddings of one denoising step, for multi-part requests (may be
  // empty: the preset is then its own single part).
  std::vector<PresetPart> parts;
};

class PresetCatalog {
 public:
  PresetCatalog() = default;

  // A catalogue of `presets`, in that order.  INVALID_ARGUMENT on an empty
  // or duplicate name, dim 0 on a preset that is not dim_overridable, a
  // spec that fails ValidateSpec with `limits` (a preset without a default
  // width is checked at limits.max_dim), or a part with an empty or repeated
  // name or naming a preset the catalogue lacks.  Messages name the preset.
  static absl::StatusOr<PresetCatalog> Create(std::vector<Preset> presets,
                                              const Limits& limits = Limits());

  // nullptr when absent.
  const Preset* Find(absl::string_view name) const;
  const std::vector<Preset>& presets() const { return presets_; }

 private:
  std::vector<Preset> presets_;  // in file order
};

}  // namespace temb

#endif  // TEMB_CORE_PRESETS_H_
