#include "temb/v1_convert/preset_catalog.h"

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "temb/base/file_reader.h"
#include "temb/base/status_macros.h"
#include "temb/v1/temb.pb.h"
#include "temb/v1_convert/conversions.h"
#include "temb/v1_convert/frequency_file.h"

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
                                                 const Limits& limits,
                                                 const std::string& base_dir) {
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
    if (!entry.frequencies_file().empty()) {
      if (base_dir.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("preset \"", entry.name(),
                         "\": frequencies_file is only read from "
                         "a catalogue file (--presets_file)"));
      }
      const std::string file =
          entry.frequencies_file()[0] == '/'
              ? entry.frequencies_file()
              : absl::StrCat(base_dir, "/", entry.frequencies_file());
      absl::StatusOr<std::vector<double>> table =
          ReadFrequencyFile(file, entry.frequencies_tensor());
      if (!table.ok()) {
        return absl::Status(table.status().code(),
                            absl::StrCat("preset \"", entry.name(),
                                         "\": ", table.status().message()));
      }
      preset->spec.frequencies =
          std::make_shared<const std::vector<double>>(*std::move(table));
    }
    presets.push_back(*std::move(preset));
  }
  return PresetCatalog::Create(std::move(presets), limits);
}

absl::StatusOr<PresetCatalog> ReadPresetCatalog(const std::string& path,
                                                const Limits& limits) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(path, "preset catalogue"));
  const size_t slash = path.rfind('/');
  const std::string base_dir =
      slash == std::string::npos ? "." : path.substr(0, slash + 1);
  absl::StatusOr<PresetCatalog> catalog =
      ParsePresetCatalog(text, limits, base_dir);
  if (!catalog.ok()) {
    return absl::Status(catalog.status().code(),
                        absl::StrCat(path, ": ", catalog.status().message()));
  }
  return catalog;
}

}  // namespace temb
