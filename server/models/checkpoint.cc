#include "temb/models/checkpoint.h"

#include <sys/stat.h>

#include <cmath>
#include <functional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "temb/base/file_reader.h"
#include "temb/base/quoted.h"
#include "temb/base/status_macros.h"

namespace temb::models {
namespace {

using ::nlohmann::json;

std::string JoinPath(const std::string& dir, const std::string& name) {
  if (dir.empty() || dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

absl::StatusOr<bool> IsRegularFile(const std::string& path) {
  struct stat info;
  if (::stat(path.c_str(), &info) != 0) {
    if (errno == ENOENT) return false;
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot stat ", path));
  }
  return S_ISREG(info.st_mode);
}

// Reads a JSON file of the folder: a regular file (never a FIFO or a
// device, which could block or never end) of at most kMaxJsonFileBytes,
// nested at most kMaxJsonDepth deep, so that parsing it recurses a bounded
// depth.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text,
                   ReadRegularFile(path, "a JSON file", kMaxJsonFileBytes));
  RETURN_IF_ERROR(CheckJsonDepth(text, kMaxJsonDepth, path));
  return text;
}

// A JSON value in a message: its first bytes (a value may be a whole file).
std::string Excerpt(const std::string& text) {
  return text.size() > 64 ? text.substr(0, 64) + "..." : text;
}
std::string Excerpt(const json& value) { return Excerpt(value.dump()); }

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfig::Parse(const std::string& file,
                                               const std::string& text) {
  RETURN_IF_ERROR(CheckJsonDepth(text, kMaxJsonDepth, file));
  const json parsed = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": not a JSON object"));
  }
  ModelConfig config;
  config.file_ = file;
  const auto class_name = parsed.find("_class_name");
  if (class_name == parsed.end() || !class_name->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": field _class_name: missing or not a string"));
  }
  config.class_name_ = class_name->get<std::string>();
  for (const auto& item : parsed.items()) {
    config.fields_[item.key()] = item.value().dump();
  }
  return config;
}

const std::string* ModelConfig::Find(const std::string& field) const {
  read_.insert(field);
  const auto it = fields_.find(field);
  return it == fields_.end() ? nullptr : &it->second;
}

std::map<std::string, std::string> ModelConfig::ReadFields() const {
  std::map<std::string, std::string> read;
  for (const std::string& field : read_) {
    const auto it = fields_.find(field);
    if (it != fields_.end()) read.emplace(field, it->second);
  }
  return read;
}

absl::StatusOr<int64_t> ModelConfig::PositiveInt(
    const std::string& field) const {
  const std::string* const it = Find(field);
  if (it == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(file_, ": field ", field, ": missing"));
  }
  const json value = json::parse(*it);
  if (!value.is_number_unsigned() || value.get<uint64_t>() == 0 ||
      value.get<uint64_t>() > (uint64_t{1} << 31)) {
    return absl::InvalidArgumentError(
        absl::StrCat(file_, ": field ", field,
                     ": must be an integer in [1, 2^31], got ", Excerpt(*it)));
  }
  return static_cast<int64_t>(value.get<uint64_t>());
}

absl::StatusOr<bool> ModelConfig::Bool(const std::string& field,
                                       bool fallback) const {
  const std::string* const it = Find(field);
  if (it == nullptr) return fallback;
  const json value = json::parse(*it);
  if (!value.is_boolean()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file_, ": field ", field, ": must be true or false, got ",
                     Excerpt(*it)));
  }
  return value.get<bool>();
}

absl::StatusOr<std::vector<int64_t>> ModelConfig::IndexList(
    const std::string& field, int64_t count) const {
  std::vector<int64_t> indices;
  const std::string* const it = Find(field);
  if (it == nullptr) return indices;
  const json value = json::parse(*it);
  if (!value.is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(
        file_, ": field ", field, ": must be a list, got ", Excerpt(*it)));
  }
  for (const json& item : value) {
    // diffusers ignores an index past the last block; such a config is
    // more likely damaged than meant, so it is refused.
    if (!item.is_number_unsigned() ||
        item.get<uint64_t>() >= static_cast<uint64_t>(count)) {
      return absl::InvalidArgumentError(
          absl::StrCat(file_, ": field ", field,
                       ": every entry must be a block index in [0, ", count,
                       "), got ", Excerpt(*it)));
    }
    indices.push_back(static_cast<int64_t>(item.get<uint64_t>()));
  }
  return indices;
}

absl::StatusOr<std::optional<bool>> ModelConfig::Flag(
    const std::string& field) const {
  const std::string* const it = Find(field);
  if (it == nullptr) return std::nullopt;
  const json value = json::parse(*it);
  if (value.is_null()) return std::nullopt;
  if (value.is_boolean()) return value.get<bool>();
  if (value.is_number()) return value.get<double>() != 0;
  return absl::InvalidArgumentError(absl::StrCat(
      file_, ": field ", field, ": must be true, false, a number or null, got ",
      Excerpt(*it)));
}

absl::StatusOr<double> ModelConfig::Number(const std::string& field,
                                           double fallback) const {
  const std::string* const it = Find(field);
  if (it == nullptr) return fallback;
  const json value = json::parse(*it);
  if (!value.is_number() || !std::isfinite(value.get<double>())) {
    return absl::InvalidArgumentError(
        absl::StrCat(file_, ": field ", field,
                     ": must be a finite number, got ", Excerpt(*it)));
  }
  return value.get<double>();
}

absl::StatusOr<int64_t> ModelConfig::PositiveIntAt(const std::string& field,
                                                   int64_t index) const {
  const std::string* const it = Find(field);
  if (it == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(file_, ": field ", field, ": missing"));
  }
  const json value = json::parse(*it);
  if (!value.is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(
        file_, ": field ", field, ": must be a list, got ", Excerpt(*it)));
  }
  const int64_t size = static_cast<int64_t>(value.size());
  const int64_t at = index < 0 ? size + index : index;
  if (at < 0 || at >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat(file_, ": field ", field, ": needs an entry ", index,
                     ", has ", size, " entries: ", Excerpt(*it)));
  }
  const json& item = value[static_cast<size_t>(at)];
  if (!item.is_number_unsigned() || item.get<uint64_t>() == 0 ||
      item.get<uint64_t>() > (uint64_t{1} << 31)) {
    return absl::InvalidArgumentError(
        absl::StrCat(file_, ": field ", field, ": entry ", at,
                     " must be an integer in [1, 2^31], got ", Excerpt(*it)));
  }
  return static_cast<int64_t>(item.get<uint64_t>());
}

bool ModelConfig::Equals(const std::string& field,
                         const std::string& json_text) const {
  const std::string* const it = Find(field);
  const json value = it == nullptr ? json(nullptr) : json::parse(*it);
  return value == json::parse(json_text);
}

absl::Status ModelConfig::Require(
    const std::string& field,
    const std::vector<std::string>& json_texts) const {
  const std::string* const it = Find(field);
  for (const std::string& supported : json_texts) {
    if (Equals(field, supported)) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      file_, ": field ", field, ": ",
      it == nullptr ? std::string("absent") : Excerpt(*it),
      " is not supported (supported: ", absl::StrJoin(json_texts, ", "), ")"));
}

absl::Status ModelConfig::RequireLength(const std::string& field,
                                        int64_t length) const {
  const std::string* const it = Find(field);
  if (it == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(file_, ": field ", field, ": missing"));
  }
  const json value = json::parse(*it);
  if (!value.is_array() || static_cast<int64_t>(value.size()) != length) {
    return absl::InvalidArgumentError(
        absl::StrCat(file_, ": field ", field, ": must be a list of ", length,
                     " entries, got ", Excerpt(*it)));
  }
  return absl::OkStatus();
}

absl::StatusOr<DType> ParseTorchDType(const std::string& name) {
  absl::StatusOr<DType> dtype = ParseDType(name);
  if (!dtype.ok() || *dtype == DType::kFloat64) {
    return absl::InvalidArgumentError(
        absl::StrCat("must be one of float32, bfloat16, float16 (or fp32, "
                     "bf16, fp16), got ",
                     Quoted(name)));
  }
  return *dtype;
}

absl::StatusOr<FolderOptions> ReadFolderOptions(const std::string& dir) {
  FolderOptions options;
  const std::string path = JoinPath(dir, kFolderOptionsFile);
  ASSIGN_OR_RETURN(const bool present, IsRegularFile(path));
  if (!present) return options;
  ASSIGN_OR_RETURN(const std::string text, ReadSmallFile(path));
  const json parsed = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a JSON object"));
  }
  for (const auto& item : parsed.items()) {
    // An unknown field is refused: a misspelt option silently ignored would
    // compute in a dtype nobody asked for.
    if (item.key() != "torch_dtype") {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": field ", Quoted(item.key()),
                       ": unknown (the known field is torch_dtype)"));
    }
    if (!item.value().is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": field torch_dtype: must be a string, got ",
                       Excerpt(item.value())));
    }
    absl::StatusOr<DType> dtype =
        ParseTorchDType(item.value().get<std::string>());
    if (!dtype.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": field torch_dtype: ", dtype.status().message()));
    }
    options.torch_dtype = *dtype;
  }
  return options;
}

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(
    const std::string& dir) {
  std::unique_ptr<Checkpoint> checkpoint(new Checkpoint());
  checkpoint->dir_ = dir;
  const std::string config_path = JoinPath(dir, kConfigFile);
  ASSIGN_OR_RETURN(const std::string config_text, ReadSmallFile(config_path));
  ASSIGN_OR_RETURN(checkpoint->config_,
                   ModelConfig::Parse(config_path, config_text));
  std::string identity =
      absl::StrCat(checkpoint->config_.class_name(),
                   "|config:", std::hash<std::string>()(config_text));

  const std::string index_path = JoinPath(dir, kWeightsIndexFile);
  const std::string single_path = JoinPath(dir, kSingleWeightsFile);
  ASSIGN_OR_RETURN(const bool has_index, IsRegularFile(index_path));
  ASSIGN_OR_RETURN(const bool has_single, IsRegularFile(single_path));
  if (has_index) {
    ASSIGN_OR_RETURN(const std::string index_text, ReadSmallFile(index_path));
    const json index =
        json::parse(index_text, nullptr, /*allow_exceptions=*/false);
    if (index.is_discarded() || !index.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": not a JSON object"));
    }
    const auto weight_map = index.find("weight_map");
    if (weight_map == index.end() || !weight_map->is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(
          index_path, ": field weight_map: missing or not an object"));
    }
    std::map<std::string, const SafetensorsFile*> shards;
    for (const auto& item : weight_map->items()) {
      if (!item.value().is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(index_path, ": tensor ", Quoted(item.key()),
                         ": field weight_map: shard is not a string"));
      }
      const std::string shard = item.value().get<std::string>();
      // A shard is a file beside the index, never a path elsewhere.
      if (shard.empty() || shard.find('/') != std::string::npos ||
          shard == "." || shard == "..") {
        return absl::InvalidArgumentError(
            absl::StrCat(index_path, ": tensor ", Quoted(item.key()),
                         ": field weight_map: shard ", Quoted(shard),
                         " is not a file name in the model folder"));
      }
      auto it = shards.find(shard);
      if (it == shards.end()) {
        ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                         SafetensorsFile::Open(JoinPath(dir, shard)));
        it = shards.emplace(shard, file.get()).first;
        checkpoint->files_.push_back(std::move(file));
      }
      if (it->second->Find(item.key()) == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat(index_path, ": tensor ", Quoted(item.key()),
                         ": field weight_map: shard ", Quoted(shard),
                         " has no such tensor"));
      }
      checkpoint->file_of_tensor_[item.key()] = it->second;
    }
  } else if (has_single) {
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                     SafetensorsFile::Open(single_path));
    for (const auto& [name, entry] : file->tensors()) {
      checkpoint->file_of_tensor_[name] = file.get();
    }
    checkpoint->files_.push_back(std::move(file));
  } else {
    return absl::NotFoundError(absl::StrCat(
        dir, ": neither ", kWeightsIndexFile, " nor ", kSingleWeightsFile));
  }
  for (const auto& file : checkpoint->files_) {
    absl::StrAppend(&identity, "|", file->path(), ":", file->file_bytes(), ":",
                    file->mtime_ns());
  }
  checkpoint->identity_ = std::move(identity);
  return checkpoint;
}

absl::StatusOr<const SafetensorsFile*> Checkpoint::FileFor(
    const std::string& name) const {
  const auto it = file_of_tensor_.find(name);
  if (it == file_of_tensor_.end()) {
    return absl::NotFoundError(absl::StrCat(dir_, ": tensor ", Quoted(name),
                                            ": missing from the checkpoint"));
  }
  return it->second;
}

absl::StatusOr<DType> Checkpoint::StoredDType(const std::string& name) const {
  ASSIGN_OR_RETURN(const SafetensorsFile* file, FileFor(name));
  const TensorEntry& entry = *file->Find(name);
  if (!entry.dtype.has_value() || *entry.dtype == DType::kFloat64) {
    return absl::InvalidArgumentError(absl::StrCat(
        file->path(), ": tensor ", Quoted(name),
        ": field dtype: ", entry.dtype_name, " is not one of F32, F16, BF16"));
  }
  return *entry.dtype;
}

absl::StatusOr<LoadedTensor> Checkpoint::Load(
    const std::string& name, DType dtype,
    const std::vector<int64_t>& shape) const {
  ASSIGN_OR_RETURN(const SafetensorsFile* file, FileFor(name));
  const TensorEntry& entry = *file->Find(name);
  if (entry.dtype != dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        file->path(), ": tensor ", Quoted(name),
        ": field dtype: ", entry.dtype_name,
        " where the model's other tensors are ", SafetensorsDTypeName(dtype)));
  }
  if (entry.shape != shape) {
    return absl::InvalidArgumentError(
        absl::StrCat(file->path(), ": tensor ", Quoted(name),
                     ": field shape: ", ShapeText(entry.shape),
                     " where config.json implies ", ShapeText(shape)));
  }
  LoadedTensor loaded;
  loaded.entry = entry;
  ASSIGN_OR_RETURN(loaded.data, file->Read(entry));
  return loaded;
}

}  // namespace temb::models
