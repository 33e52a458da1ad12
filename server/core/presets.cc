#include "temb/core/presets.h"

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"

namespace temb {
namespace {

absl::Status CheckPreset(const Preset& preset, const Limits& limits) {
  if (preset.spec.dim == 0 && !preset.dim_overridable) {
    return absl::InvalidArgumentError(
        "spec.dim is required unless dim_overridable is true");
  }
  // A preset without a default width is checked at the widest width the
  // server accepts; ResolveSpec checks the caller's dim again.
  EmbeddingSpec checked = preset.spec;
  if (checked.dim == 0) checked.dim = limits.max_dim;
  absl::Status status = ValidateSpec(checked, limits);
  if (!status.ok()) return absl::InvalidArgumentError(status.message());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PresetCatalog> PresetCatalog::Create(std::vector<Preset> presets,
                                                    const Limits& limits) {
  std::set<std::string> names;
  for (size_t i = 0; i < presets.size(); ++i) {
    const Preset& preset = presets[i];
    if (preset.name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("preset catalogue: entry ", i, " has an empty name"));
    }
    if (!names.insert(preset.name).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "preset catalogue: duplicate preset \"", preset.name, "\""));
    }
    if (absl::Status status = CheckPreset(preset, limits); !status.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("preset \"", preset.name, "\": ", status.message()));
    }
  }
  for (const Preset& preset : presets) {
    std::set<std::string> part_names;
    for (const PresetPart& part : preset.parts) {
      if (part.name.empty() || !part_names.insert(part.name).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("preset \"", preset.name,
                         "\": part names must be non-empty and "
                         "distinct, got \"",
                         part.name, "\""));
      }
      if (names.count(part.preset) == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("preset \"", preset.name, "\": part \"", part.name,
                         "\" names an unknown preset \"", part.preset, "\""));
      }
    }
  }
  PresetCatalog catalog;
  catalog.presets_ = std::move(presets);
  return catalog;
}

const Preset* PresetCatalog::Find(absl::string_view name) const {
  for (const Preset& preset : presets_) {
    if (preset.name == name) return &preset;
  }
  return nullptr;
}

}  // namespace temb
