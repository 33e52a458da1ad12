// Preset catalogues as temb.v1.PresetCatalog text protos: the built-in one
// (presets.textproto, compiled in) and a user's --presets_file.
#ifndef TEMB_V1_CONVERT_PRESET_CATALOG_H_
#define TEMB_V1_CONVERT_PRESET_CATALOG_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "temb/core/presets.h"

namespace temb {

// The catalogue compiled into the binary.
const PresetCatalog& BuiltInPresetCatalog();

// Parses a temb.v1.PresetCatalog text proto and checks it against `limits`
// (PresetCatalog::Create).  INVALID_ARGUMENT on a syntax error (with line and
// column) or any rule of PresetFromProto and PresetCatalog::Create.
// frequencies_file entries are read relative to `base_dir`, and refused when
// it is empty (the built-in catalogue); their errors are ReadFrequencyFile's.
absl::StatusOr<PresetCatalog> ParsePresetCatalog(
    absl::string_view text, const Limits& limits = Limits(),
    const std::string& base_dir = "");

// Reads (ReadFile's codes) and parses a file; errors name the path.
absl::StatusOr<PresetCatalog> ReadPresetCatalog(
    const std::string& path, const Limits& limits = Limits());

}  // namespace temb

#endif  // TEMB_V1_CONVERT_PRESET_CATALOG_H_
