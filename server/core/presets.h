// Named embedding conventions per model family ("sd15", "sdxl", "flux", ...).
//
// The built-in catalogue is compiled in from presets.textproto (format:
// temb.v1.PresetCatalog); a server may replace it with the user's own file.
#ifndef TEMB_SERVER_CORE_PRESETS_H_
#define TEMB_SERVER_CORE_PRESETS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "temb/kernels/embedding_spec.h"

namespace temb {

struct Preset {
  std::string name;
  std::string description;
  // The fixed convention; spec.dim is the default width and spec.dtype the
  // default output dtype.  spec.dim is 0 only for a dim_overridable preset
  // without a default width (e.g. "ldm"): callers must then choose dim.
  EmbeddingSpec spec;
  // Whether callers may choose dim (e.g. "transformer", "ldm").
  bool dim_overridable = false;
};

class PresetCatalog {
 public:
  // The catalogue compiled into the binary.
  static const PresetCatalog& BuiltIn();
  // Parses a temb.v1.PresetCatalog text proto.  INVALID_ARGUMENT on a syntax
  // error (with line and column), a duplicate or empty name, a spec without
  // flip_sin_to_cos or downscale_freq_shift, a missing dim on a preset that is
  // not dim_overridable, or a spec that fails ValidateSpec with default
  // Limits (the message names the preset).
  static absl::StatusOr<PresetCatalog> FromTextProto(absl::string_view text);
  // Reads and parses a file; NOT_FOUND when it cannot be read.
  static absl::StatusOr<PresetCatalog> FromFile(const std::string& path);

  // nullptr when absent.
  const Preset* Find(absl::string_view name) const;
  const std::vector<Preset>& presets() const { return presets_; }

 private:
  std::vector<Preset> presets_;  // in file order
};

}  // namespace temb

#endif  // TEMB_SERVER_CORE_PRESETS_H_
