#include "temb/v1_convert/preset_catalog.h"

#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "temb/base/file_reader.h"
#include "temb/base/status_macros.h"
#include "temb/v1/temb.pb.h"
#include "temb/v1_convert/conversions.h"

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

}  // namespace

const PresetCatalog& BuiltInPresetCatalog() {
  static const PresetCatalog* const catalog = [] {
    auto parsed = ParsePresetCatalog(internal::kBuiltInPresetsTextProto);
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

absl::StatusOr<PresetCatalog> ParsePresetCatalog(absl::string_view text,
                                                 const Limits& limits) {
  v1::PresetCatalog proto;
  google::protobuf::TextFormat::Parser parser;
  FirstErrorCollector errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(std::string(text), &proto)) {
    return absl::InvalidArgumentError(
        absl::StrCat("preset catalogue: ", errors.error()));
  }
  std::vector<Preset> presets;
  for (const v1::Preset& entry : proto.presets()) {
    absl::StatusOr<Preset> preset = PresetFromProto(entry);
    if (!preset.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "preset \"", entry.name(), "\": ", preset.status().message()));
    }
    presets.push_back(*std::move(preset));
  }
  return PresetCatalog::Create(std::move(presets), limits);
}

absl::StatusOr<PresetCatalog> ReadPresetCatalog(const std::string& path,
                                                const Limits& limits) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(path, "preset catalogue"));
  absl::StatusOr<PresetCatalog> catalog = ParsePresetCatalog(text, limits);
  if (!catalog.ok()) {
    return absl::Status(catalog.status().code(),
                        absl::StrCat(path, ": ", catalog.status().message()));
  }
  return catalog;
}

}  // namespace temb
