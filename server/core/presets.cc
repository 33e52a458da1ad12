#include "server/core/presets.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "server/core/proto_conversions.h"
#include "temb/v1/temb.pb.h"

namespace temb {
namespace internal {
extern const absl::string_view kBuiltInPresetsTextProto;  // generated
}  // namespace internal

namespace {

// Keeps the first syntax error with its 1-based position.
class FirstErrorCollector final : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (error_.empty()) {
      error_ = absl::StrCat("line ", line + 1, ", column ", column + 1, ": ",
                            message);
    }
  }
  const std::string& error() const { return error_; }

 private:
  std::string error_;
};

absl::StatusOr<Preset> PresetFromProto(const v1::Preset& proto) {
  auto request = SpecRequestFromProto("", proto.spec(), proto.default_dtype());
  if (!request.ok()) return request.status();
  if (!request->flip_sin_to_cos || !request->downscale_freq_shift) {
    return absl::InvalidArgumentError(
        "spec must set flip_sin_to_cos and downscale_freq_shift explicitly");
  }
  if (!request->dim && !proto.dim_overridable()) {
    return absl::InvalidArgumentError(
        "spec.dim is required unless dim_overridable is true");
  }
  Preset preset;
  preset.name = proto.name();
  preset.description = proto.description();
  preset.dim_overridable = proto.dim_overridable();
  EmbeddingSpec& spec = preset.spec;
  spec.dim = request->dim.value_or(0);
  spec.max_period = request->max_period.value_or(spec.max_period);
  spec.flip_sin_to_cos = *request->flip_sin_to_cos;
  spec.downscale_freq_shift = *request->downscale_freq_shift;
  spec.scale = request->scale.value_or(spec.scale);
  spec.time_factor = request->time_factor.value_or(spec.time_factor);
  spec.repeat_only = request->repeat_only.value_or(spec.repeat_only);
  spec.layout = request->layout.value_or(spec.layout);
  spec.precision = request->precision.value_or(spec.precision);
  spec.dtype = request->dtype.value_or(spec.dtype);

  // A preset without a default width is checked at the widest width a
  // default server accepts; ResolveSpec checks the caller's dim again.
  EmbeddingSpec checked = spec;
  const Limits limits;
  if (checked.dim == 0) checked.dim = limits.max_dim;
  absl::Status status = ValidateSpec(checked, limits);
  if (!status.ok()) return absl::InvalidArgumentError(status.message());
  return preset;
}

}  // namespace

const PresetCatalog& PresetCatalog::BuiltIn() {
  static const PresetCatalog* const catalog = [] {
    auto parsed = FromTextProto(internal::kBuiltInPresetsTextProto);
    if (!parsed.ok()) {
      // Unreachable in a tested build: the catalogue is compiled in.
      std::fprintf(stderr, "built-in preset catalogue is invalid: %s\n",
                   parsed.status().ToString().c_str());
      std::abort();
    }
    return new PresetCatalog(*std::move(parsed));
  }();
  return *catalog;
}

absl::StatusOr<PresetCatalog> PresetCatalog::FromTextProto(
    absl::string_view text) {
  v1::PresetCatalog proto;
  google::protobuf::TextFormat::Parser parser;
  FirstErrorCollector errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(std::string(text), &proto)) {
    return absl::InvalidArgumentError(
        absl::StrCat("preset catalogue: ", errors.error()));
  }
  PresetCatalog catalog;
  std::set<std::string> names;
  for (int i = 0; i < proto.presets_size(); ++i) {
    const v1::Preset& entry = proto.presets(i);
    if (entry.name().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("preset catalogue: entry ", i, " has an empty name"));
    }
    if (!names.insert(entry.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "preset catalogue: duplicate preset \"", entry.name(), "\""));
    }
    auto preset = PresetFromProto(entry);
    if (!preset.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "preset \"", entry.name(), "\": ", preset.status().message()));
    }
    catalog.presets_.push_back(*std::move(preset));
  }
  return catalog;
}

absl::StatusOr<PresetCatalog> PresetCatalog::FromFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    return absl::NotFoundError(
        absl::StrCat("cannot read preset catalogue \"", path, "\""));
  }
  std::ostringstream text;
  text << file.rdbuf();
  auto catalog = FromTextProto(text.str());
  if (!catalog.ok()) {
    return absl::Status(catalog.status().code(),
                        absl::StrCat(path, ": ", catalog.status().message()));
  }
  return catalog;
}

const Preset* PresetCatalog::Find(absl::string_view name) const {
  for (const Preset& preset : presets_) {
    if (preset.name == name) return &preset;
  }
  return nullptr;
}

}  // namespace temb
