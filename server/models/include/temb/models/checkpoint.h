// A diffusers model folder: config.json and the weights, in either of the
// forms save_pretrained writes:
//   diffusion_pytorch_model.safetensors                  (one file), or
//   diffusion_pytorch_model.safetensors.index.json       ({"weight_map":
//     {tensor: shard file}}) and the shards it names, beside it.
// Every file is checked when the folder is opened (safetensors.h); tensors
// are read only when asked for, by name, with their dtype and shape checked
// against what the caller expects.
#ifndef TEMB_MODELS_CHECKPOINT_H_
#define TEMB_MODELS_CHECKPOINT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "temb/kernels/dtype.h"
#include "temb/models/safetensors.h"

namespace temb::models {

inline constexpr char kConfigFile[] = "config.json";
inline constexpr char kSingleWeightsFile[] =
    "diffusion_pytorch_model.safetensors";
inline constexpr char kWeightsIndexFile[] =
    "diffusion_pytorch_model.safetensors.index.json";
// config.json and the index are small; a larger one is refused unread.
inline constexpr uint64_t kMaxJsonFileBytes = uint64_t{16} << 20;
// temb's own optional file in a model folder: how to load the model, where
// a pipeline passes arguments to from_pretrained.  A JSON object; its one
// field is "torch_dtype".
inline constexpr char kFolderOptionsFile[] = "temb.json";

// The dtype a model computes in when loaded as from_pretrained(torch_dtype=
// ...) loads it: "float32", "bfloat16" or "float16" (or fp32, bf16, fp16).
// INVALID_ARGUMENT naming the accepted values otherwise (float64 included:
// no family computes in it).
absl::StatusOr<DType> ParseTorchDType(const std::string& name);

// What temb.json says; every field unset when the folder has no such file.
struct FolderOptions {
  std::optional<DType> torch_dtype;  // unset: the stored dtype
};

// Reads `dir`/temb.json.  INVALID_ARGUMENT naming the file and the field for
// malformed JSON, an unknown field or a value that is not accepted.
absl::StatusOr<FolderOptions> ReadFolderOptions(const std::string& dir);

// config.json, read once.  Getters name the file and the field in errors:
// `config.json: field num_layers: missing`.
class ModelConfig {
 public:
  // INVALID_ARGUMENT for malformed JSON, a non-object, or a missing or
  // non-string `_class_name`.
  static absl::StatusOr<ModelConfig> Parse(const std::string& file,
                                           const std::string& text);

  const std::string& class_name() const { return class_name_; }
  const std::string& file() const { return file_; }
  // A positive integer field.
  absl::StatusOr<int64_t> PositiveInt(const std::string& field) const;
  // A boolean field, `fallback` when absent (diffusers omits nothing it
  // registers, but older configs predate some flags).
  absl::StatusOr<bool> Bool(const std::string& field, bool fallback) const;
  // A list of block indices, each in [0, count): SD3.5's
  // dual_attention_layers.  Empty when absent, as in configs written before
  // the field existed.
  absl::StatusOr<std::vector<int64_t>> IndexList(const std::string& field,
                                                 int64_t count) const;
  // A field read as a condition: true or false; a number, true when
  // non-zero (CogVideoX's ofs_embed_dim); nullopt when absent or null.
  absl::StatusOr<std::optional<bool>> Flag(const std::string& field) const;
  // A finite number field, `fallback` when absent.
  absl::StatusOr<double> Number(const std::string& field,
                                double fallback) const;
  // Entry `index` of a list of positive integers (negative: from the end,
  // -1 is the last): the UNet's block_out_channels.
  absl::StatusOr<int64_t> PositiveIntAt(const std::string& field,
                                        int64_t index) const;
  // Whether the field equals the JSON value `json_text` (an absent field
  // counts as null).
  bool Equals(const std::string& field, const std::string& json_text) const;
  // OK when the field equals one of the JSON values `json_texts` (an absent
  // field counts as null); otherwise INVALID_ARGUMENT naming the field, what
  // it holds and what is supported.
  absl::Status Require(const std::string& field,
                       const std::vector<std::string>& json_texts) const;
  // OK when the field is a list of `length` entries.
  absl::Status RequireLength(const std::string& field, int64_t length) const;
  // The fields the getters above were asked for that config.json has, each
  // as its JSON text.
  std::map<std::string, std::string> ReadFields() const;

 private:
  // The field's JSON text, or nullptr when absent; the name is recorded
  // for ReadFields().
  const std::string* Find(const std::string& field) const;

  std::string file_;
  std::string class_name_;
  std::map<std::string, std::string> fields_;  // key -> JSON text
  mutable std::set<std::string> read_;
};

// A tensor read from the checkpoint: its checked description and bytes.
struct LoadedTensor {
  TensorEntry entry;
  WeightBytes data;
};

class Checkpoint {
 public:
  // Opens `dir`: config.json, then the index and its shards or the single
  // file.  NOT_FOUND when neither weights form exists; INVALID_ARGUMENT
  // naming the file and field for anything malformed (including an index
  // naming a shard outside the folder or a tensor its shard lacks).
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(
      const std::string& dir);

  const std::string& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }

  // Reads tensor `name`, which must have `dtype` and `shape`.  NOT_FOUND
  // naming the tensor when absent; INVALID_ARGUMENT naming the file, the
  // tensor and the field (dtype or shape) when it disagrees.
  absl::StatusOr<LoadedTensor> Load(const std::string& name, DType dtype,
                                    const std::vector<int64_t>& shape) const;
  // The stored dtype of tensor `name` (NOT_FOUND when absent;
  // INVALID_ARGUMENT when it is not a floating dtype temb computes in).
  absl::StatusOr<DType> StoredDType(const std::string& name) const;

  // How many tensors the index or header names: no family reads more, which
  // bounds every count of blocks a config.json may claim.
  int64_t tensor_count() const {
    return static_cast<int64_t>(file_of_tensor_.size());
  }

  // Identifies these weights without hashing gigabytes: every weights
  // file's name, size and modification time, and a hash of config.json.
  const std::string& weights_identity() const { return identity_; }

 private:
  Checkpoint() = default;
  absl::StatusOr<const SafetensorsFile*> FileFor(const std::string& name) const;

  std::string dir_;
  ModelConfig config_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> file_of_tensor_;
  std::string identity_;
};

}  // namespace temb::models

#endif  // TEMB_MODELS_CHECKPOINT_H_
