#include "temb/models/conditioning_model.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "temb/base/quoted.h"
#include "temb/base/status_macros.h"
#include "temb/kernels/cpu_backend.h"
#include "temb/kernels/embedding_spec.h"
#include "temb/kernels/linear.h"
#include "temb/models/weight_fingerprint.h"

namespace temb::models {

struct ConditioningModel::Value {
  int64_t cols = 1;    // floats per row
  int64_t blocks = 0;  // > 0: a stacked value [L = blocks, cols / blocks]
  bool scalar = true;  // [N]
  ValueDType dtype = ValueDType::kFloat32;
  uint32_t depends = 0;  // a bit per family input (InputBit)
  int producer = -1;     // index into ops_, -1 for an input
};

struct ConditioningModel::PlannedOp {
  const Op* op = nullptr;
  int64_t in_width = 0;
  int64_t out_width = 0;  // per block for a stacked linear
  int64_t blocks = 1;
  std::vector<LoadedTensor> weights;     // one per block
  std::vector<LoadedTensor> biases;      // empty data for a Linear without
  DType weight_dtype = DType::kFloat32;  // of weights and biases
  int64_t groups = 1;                    // kLinear, kRmsNorm, kRepeatBeside
  SinusoidParams sinusoid;               // kSinusoid, config fields resolved
  // kDivide, kMultiply, kSubtractFrom, kRange, as float32
  float constant = 0;
  // kTableAdd: one per block; kEmbedding: its one table; kRmsNorm: its
  // weight.
  std::vector<std::vector<float>> tables;
  std::vector<int> engine_ids;  // kLinear on a LinearEngine: one per block
};

namespace {

bool FlagHolds(const FamilyDescription& family, const ModelConfig& config,
               const std::string& when, absl::Status* status) {
  if (when.empty()) return true;
  const bool negate = when[0] == '!';
  const std::string flag = negate ? when.substr(1) : when;
  if (const size_t equals = flag.find('='); equals != std::string::npos) {
    return config.Equals(flag.substr(0, equals), flag.substr(equals + 1)) !=
           negate;
  }
  absl::StatusOr<std::optional<bool>> value = config.Flag(flag);
  if (!value.ok()) {
    *status = value.status();
    return false;
  }
  bool holds = value->value_or(false);
  if (!value->has_value()) {
    for (const FlagDefault& rule : family.flag_defaults) {
      if (rule.flag != flag) continue;
      absl::StatusOr<int64_t> field = config.PositiveInt(rule.field);
      if (!field.ok()) {
        *status = field.status();
        return false;
      }
      holds = *field == rule.equals;
    }
  }
  return holds != negate;
}

// The blocks a stacked linear covers, in increasing index.
absl::StatusOr<std::vector<int64_t>> SelectBlocks(const ModelConfig& config,
                                                  const Op& op, int64_t count) {
  std::vector<int64_t> indices;
  std::vector<int64_t> listed;
  if (op.select == BlockSelect::kListed ||
      op.select == BlockSelect::kUnlisted) {
    ASSIGN_OR_RETURN(listed, config.IndexList(op.block_list, count));
  }
  for (int64_t block = 0; block < count; ++block) {
    const bool in_list =
        std::find(listed.begin(), listed.end(), block) != listed.end();
    bool take = true;
    switch (op.select) {
      case BlockSelect::kAll:
        break;
      case BlockSelect::kAllButLast:
        take = block < count - 1;
        break;
      case BlockSelect::kLast:
        take = block == count - 1;
        break;
      case BlockSelect::kListed:
        take = in_list;
        break;
      case BlockSelect::kUnlisted:
        take = !in_list;
        break;
    }
    if (take) indices.push_back(block);
  }
  return indices;
}

// The value of a config expression (family.h): terms of field names, list
// entries and integer literals, joined by + - *.  A malformed expression is
// a bug in the family's description; a bad field names the config.
class ConfigExpression {
 public:
  ConfigExpression(const ModelConfig& config, const std::string& text)
      : config_(config), text_(text) {}

  absl::StatusOr<int64_t> Evaluate() {
    ASSIGN_OR_RETURN(const int64_t value, Sum());
    if (Skip(), pos_ < text_.size()) return Malformed();
    if (value < 1 || value > (int64_t{1} << 31)) return OutOfRange(value);
    return value;
  }

 private:
  // Terms joined by + and -, up to the end, a ',' or a ')'.
  absl::StatusOr<int64_t> Sum() {
    ASSIGN_OR_RETURN(int64_t value, Term());
    while (Skip(),
           pos_ < text_.size() && text_[pos_] != ',' && text_[pos_] != ')') {
      const char op = text_[pos_];
      if (op != '+' && op != '-') return Malformed();
      ++pos_;
      ASSIGN_OR_RETURN(const int64_t term, Term());
      value = op == '+' ? value + term : value - term;
    }
    return value;
  }

  // min(a, b): Lumina-Image-2.0's min(hidden_size, 1024) wide embedding.
  absl::StatusOr<int64_t> Min() {
    ASSIGN_OR_RETURN(const int64_t a, Sum());
    if (Skip(), pos_ >= text_.size() || text_[pos_] != ',') return Malformed();
    ++pos_;
    ASSIGN_OR_RETURN(const int64_t b, Sum());
    if (Skip(), pos_ >= text_.size() || text_[pos_] != ')') return Malformed();
    ++pos_;
    for (const int64_t value : {a, b}) {
      if (value < 1 || value > (int64_t{1} << 31)) return OutOfRange(value);
    }
    return std::min(a, b);
  }

  void Skip() {
    while (pos_ < text_.size() && text_[pos_] == ' ') ++pos_;
  }

  absl::Status OutOfRange(int64_t value) const {
    return absl::InvalidArgumentError(
        absl::StrCat(config_.file(), ": config expression ", text_, " is ",
                     value, ", must be in [1, 2^31]"));
  }

  absl::Status Malformed() const {
    return absl::InternalError(
        absl::StrCat("malformed config expression ", Quoted(text_)));
  }

  absl::StatusOr<int64_t> Term() {
    ASSIGN_OR_RETURN(int64_t value, Factor());
    while (Skip(), pos_ < text_.size() && text_[pos_] == '*') {
      ++pos_;
      ASSIGN_OR_RETURN(const int64_t factor, Factor());
      value *= factor;  // each factor is at most 2^31: no overflow here
      if (value > (int64_t{1} << 31)) return OutOfRange(value);
    }
    return value;
  }

  // A literal below 2^20, or a field with an optional [index] (negative:
  // from the end).
  absl::StatusOr<int64_t> Factor() {
    Skip();
    const size_t start = pos_;
    if (pos_ < text_.size() &&
        std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
      int64_t literal = 0;
      while (pos_ < text_.size() &&
             std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
        literal = literal * 10 + (text_[pos_++] - '0');
        if (literal >= (1 << 20)) return Malformed();
      }
      return literal;
    }
    while (pos_ < text_.size() &&
           (std::isalnum(static_cast<unsigned char>(text_[pos_])) ||
            text_[pos_] == '_')) {
      ++pos_;
    }
    if (pos_ == start) return Malformed();
    const std::string field = text_.substr(start, pos_ - start);
    if (field == "min" && pos_ < text_.size() && text_[pos_] == '(') {
      ++pos_;
      return Min();
    }
    if (pos_ >= text_.size() || text_[pos_] != '[') {
      return config_.PositiveInt(field);
    }
    ++pos_;
    const bool negative = pos_ < text_.size() && text_[pos_] == '-';
    if (negative) ++pos_;
    int64_t index = 0;
    const size_t digits = pos_;
    while (pos_ < text_.size() &&
           std::isdigit(static_cast<unsigned char>(text_[pos_])) &&
           index < (1 << 20)) {
      index = index * 10 + (text_[pos_++] - '0');
    }
    if (pos_ == digits || pos_ >= text_.size() || text_[pos_] != ']') {
      return Malformed();
    }
    ++pos_;
    return config_.PositiveIntAt(field, negative ? -index : index);
  }

  const ModelConfig& config_;
  const std::string& text_;
  size_t pos_ = 0;
};

absl::StatusOr<int64_t> EvaluateConfig(const ModelConfig& config,
                                       const std::string& text) {
  return ConfigExpression(config, text).Evaluate();
}

uint32_t InputBit(const std::vector<InputSpec>& inputs,
                  const std::string& name) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].name == name) return 1u << i;
  }
  return 0;
}

float Rounded(float value, ValueDType where, DType model) {
  return where == ValueDType::kModel ? RoundToDType(value, model) : value;
}

void AppendEncoded(const float* values, int64_t count, DType dtype,
                   std::string* out) {
  // Grown once, then written in place: a 50-step plan's outputs are
  // millions of elements, and appending 2 bytes at a time cost more than
  // the conversion.
  const size_t start = out->size();
  const size_t element = dtype == DType::kFloat32 ? 4 : 2;
  out->resize(start + element * static_cast<size_t>(count));
  char* dst = out->data() + start;
  if (dtype == DType::kFloat32) {
    std::memcpy(dst, values, 4 * static_cast<size_t>(count));
    return;
  }
  if (dtype == DType::kBFloat16) {
    for (int64_t i = 0; i < count; ++i) {
      const uint16_t bits = FloatToBFloat16(values[i]);
      std::memcpy(dst + 2 * i, &bits, 2);
    }
    return;
  }
  for (int64_t i = 0; i < count; ++i) {
    const uint16_t bits = FloatToHalf(values[i]);
    std::memcpy(dst + 2 * i, &bits, 2);
  }
}

void DecodeInto(const char* bytes, int64_t count, DType dtype, float* out) {
  if (dtype == DType::kFloat32) {
    std::memcpy(out, bytes, 4 * static_cast<size_t>(count));
    return;
  }
  if (dtype == DType::kBFloat16) {
    for (int64_t i = 0; i < count; ++i) {
      // A bf16 is the upper half of a float32 (BFloat16ToFloat, inline).
      uint16_t bits;
      std::memcpy(&bits, bytes + 2 * i, 2);
      const uint32_t wide = static_cast<uint32_t>(bits) << 16;
      std::memcpy(&out[i], &wide, 4);
    }
    return;
  }
  for (int64_t i = 0; i < count; ++i) {
    uint16_t bits;
    std::memcpy(&bits, bytes + 2 * i, 2);
    out[i] = HalfToFloat(bits);
  }
}

// Tensor `name` of `shape` as the op reads it: in the model's dtype
// (`model`, which the stored dtype must be unless `convert`), or float32
// from any stored floating dtype.  With `convert`, any stored floating
// dtype is converted to `dtype` as torch's .to(dtype) does: through the
// exact float32 value, rounded to nearest even.
absl::StatusOr<LoadedTensor> LoadAs(const Checkpoint& checkpoint,
                                    const std::string& name, DType dtype,
                                    const std::vector<int64_t>& shape,
                                    bool convert = false) {
  if (dtype != DType::kFloat32 && !convert) {
    return checkpoint.Load(name, dtype, shape);
  }
  ASSIGN_OR_RETURN(const DType stored, checkpoint.StoredDType(name));
  ASSIGN_OR_RETURN(LoadedTensor tensor, checkpoint.Load(name, stored, shape));
  if (stored == dtype) return tensor;
  const int64_t count =
      static_cast<int64_t>(tensor.data.size()) / DTypeSize(stored);
  std::vector<float> values(static_cast<size_t>(count));
  DecodeInto(reinterpret_cast<const char*>(tensor.data.data()), count, stored,
             values.data());
  // A new buffer of the converted size: assigning into the stored one would
  // keep its capacity, and an fp32 checkpoint run in bf16 would hold twice
  // the bytes it uses.
  WeightBytes converted(static_cast<size_t>(count) * DTypeSize(dtype));
  for (int64_t i = 0; i < count; ++i) {
    if (dtype == DType::kFloat32) {
      std::memcpy(&converted[i * 4], &values[i], 4);
    } else {
      const uint16_t bits = dtype == DType::kBFloat16
                                ? FloatToBFloat16(values[i])
                                : FloatToHalf(values[i]);
      std::memcpy(&converted[i * 2], &bits, 2);
    }
  }
  tensor.data = std::move(converted);
  tensor.entry.dtype = dtype;
  tensor.entry.dtype_name = std::string(SafetensorsDTypeName(dtype));
  return tensor;
}

}  // namespace

ConditioningModel::~ConditioningModel() = default;

void ConditioningModel::Fingerprint(const std::string& name, DType dtype,
                                    const LoadedTensor& tensor) {
  weight_fingerprints_[name] = WeightFingerprint(
      dtype, absl::MakeConstSpan(tensor.data.data(), tensor.data.size()));
}

absl::StatusOr<std::unique_ptr<ConditioningModel>> ConditioningModel::Load(
    const std::string& dir, const ConditioningOptions& options) {
  if (options.threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("threads must be >= 1, got ", options.threads));
  }
  if (options.torch_dtype == DType::kFloat64) {
    return absl::InvalidArgumentError(
        "torch_dtype: fp64 is not one of fp32, bf16, fp16");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> checkpoint,
                   Checkpoint::Open(dir));
  ASSIGN_OR_RETURN(const FolderOptions folder_options, ReadFolderOptions(dir));
  const FamilyDescription* family =
      FindFamily(checkpoint->config().class_name());
  if (family == nullptr) {
    std::vector<std::string> known;
    for (const FamilyDescription& f : Families()) known.push_back(f.class_name);
    return absl::InvalidArgumentError(absl::StrCat(
        dir, "/", kConfigFile,
        ": field _class_name: ", Quoted(checkpoint->config().class_name()),
        " is not a supported family (supported: ", absl::StrJoin(known, ", "),
        ")"));
  }
  std::unique_ptr<ConditioningModel> model(new ConditioningModel());
  model->family_ = family;
  model->options_ = options;
  model->sinusoid_backend_ = CreateCpuBackend(options.threads);
  // The option wins over the folder's file: a command line overrides what
  // the folder says.
  model->torch_dtype_ = options.torch_dtype.has_value()
                            ? options.torch_dtype
                            : folder_options.torch_dtype;
  RETURN_IF_ERROR(model->Plan(*checkpoint));
  if (options.linear_engine != nullptr) {
    RETURN_IF_ERROR(model->UploadLinears());
  }
  // Rows summed by another engine may round differently: never shared.  The
  // torch_dtype is part of the weights' identity: the same files converted
  // are other weights than the same files as stored.
  model->cache_key_ = absl::StrCat(
      family->name, "|", DTypeName(model->dtype_), "|torch_dtype:",
      model->torch_dtype_.has_value() ? DTypeName(*model->torch_dtype_)
                                      : "stored",
      "|", checkpoint->weights_identity(), "|",
      options.linear_engine != nullptr ? options.linear_engine->name() : "cpu");
  return model;
}

absl::Status ConditioningModel::UploadLinears() {
  for (PlannedOp& planned : ops_) {
    if (planned.op->kind != OpKind::kLinear) continue;
    for (int64_t block = 0; block < planned.blocks; ++block) {
      LinearWeights weights;
      weights.weight = planned.weights[block].data;
      weights.bias = planned.biases[block].data;
      weights.dtype = planned.weight_dtype;
      weights.in_features = planned.in_width;
      weights.out_features = planned.out_width;
      ASSIGN_OR_RETURN(const int id, options_.linear_engine->Upload(weights));
      planned.engine_ids.push_back(id);
      // The device holds them now.
      WeightBytes().swap(planned.weights[block].data);
      WeightBytes().swap(planned.biases[block].data);
    }
  }
  return absl::OkStatus();
}

absl::Status ConditioningModel::Plan(const Checkpoint& checkpoint) {
  const ModelConfig& config = checkpoint.config();
  width_ = 1;
  for (const ConfigRequirement& requirement : family_->requirements) {
    if (requirement.length >= 0) {
      RETURN_IF_ERROR(
          config.RequireLength(requirement.field, requirement.length));
      continue;
    }
    std::vector<std::string> supported = {requirement.value};
    supported.insert(supported.end(), requirement.also.begin(),
                     requirement.also.end());
    RETURN_IF_ERROR(config.Require(requirement.field, supported));
  }
  for (const std::string& field : family_->width_fields) {
    ASSIGN_OR_RETURN(const int64_t factor, EvaluateConfig(config, field));
    width_ *= factor;
  }
  for (const std::string& flag : family_->unsupported_flags) {
    ASSIGN_OR_RETURN(const bool set, config.Bool(flag, false));
    if (set) {
      return absl::InvalidArgumentError(
          absl::StrCat(checkpoint.dir(), "/", kConfigFile, ": field ", flag,
                       ": true is not supported for ", family_->name, " yet"));
    }
  }
  absl::Status flag_status;
  for (const InputSpec& input : family_->inputs) {
    if (!FlagHolds(*family_, config, input.when, &flag_status)) {
      RETURN_IF_ERROR(flag_status);
      continue;
    }
    Value value;
    value.depends = InputBit(family_->inputs, input.name);
    if (!input.width_field.empty()) {
      ASSIGN_OR_RETURN(value.cols, EvaluateConfig(config, input.width_field));
      value.scalar = false;
    }
    value_info_[input.name] = value;
    inputs_.push_back(input);
  }
  // The model's dtype is the stored dtype of its first tensor read in the
  // model's dtype (a Linear's weight or a table); every other such tensor
  // must agree (Checkpoint::Load checks).  Tensors read as float32 (kept
  // modules) may be stored in any floating dtype.  A torch_dtype sets the
  // model's dtype instead, and then every tensor may be stored in any
  // floating dtype: each is converted, as from_pretrained converts it.
  bool dtype_known = torch_dtype_.has_value();
  if (dtype_known) dtype_ = *torch_dtype_;
  const bool convert = dtype_known;
  std::set<std::string> absent;  // values over an empty block selection
  for (const Op& op : family_->ops) {
    if (!FlagHolds(*family_, config, op.when, &flag_status)) {
      RETURN_IF_ERROR(flag_status);
      continue;
    }
    PlannedOp planned;
    planned.op = &op;
    std::vector<const Value*> in;
    for (const std::string& name : op.in) {
      const auto it = value_info_.find(name);
      if (it == value_info_.end()) {
        return absl::InternalError(absl::StrCat(
            family_->name, ": op ", op.out, " reads undefined value ", name));
      }
      in.push_back(&it->second);
    }
    Value out;
    out.producer = static_cast<int>(ops_.size());
    out.dtype = op.dtype;
    for (const Value* value : in) out.depends |= value->depends;
    out.cols = in[0]->cols;
    out.scalar = in[0]->scalar;
    planned.groups = op.groups;
    if (!op.groups_field.empty()) {
      ASSIGN_OR_RETURN(planned.groups, EvaluateConfig(config, op.groups_field));
    }
    switch (op.kind) {
      case OpKind::kRange: {
        ASSIGN_OR_RETURN(out.cols, EvaluateConfig(config, op.width_field));
        out.scalar = false;
        planned.constant = static_cast<float>(op.constant);
        break;
      }
      case OpKind::kRepeatBeside:
        if (in[1]->blocks > 0 || in[1]->cols % planned.groups != 0) {
          return absl::InternalError(
              absl::StrCat(family_->name, ": ", op.out, ": ", op.in[1],
                           " is not ", planned.groups, " equal parts"));
        }
        out.cols = planned.groups * in[0]->cols + in[1]->cols;
        out.scalar = false;
        break;
      case OpKind::kRmsNorm: {
        if (in[0]->cols % planned.groups != 0) {
          return absl::InternalError(
              absl::StrCat(family_->name, ": ", op.out, ": ", op.in[0],
                           " is not ", planned.groups, " equal parts"));
        }
        planned.in_width = in[0]->cols / planned.groups;
        if (!dtype_known) {
          ASSIGN_OR_RETURN(dtype_, checkpoint.StoredDType(op.weight));
          dtype_known = true;
        }
        ASSIGN_OR_RETURN(
            LoadedTensor weight,
            LoadAs(checkpoint, op.weight, dtype_, {planned.in_width}, convert));
        weight_bytes_ += static_cast<int64_t>(weight.data.size());
        Fingerprint(op.weight, dtype_, weight);
        std::vector<float> values(static_cast<size_t>(planned.in_width));
        DecodeInto(reinterpret_cast<const char*>(weight.data.data()),
                   planned.in_width, dtype_, values.data());
        planned.tables.push_back(std::move(values));
        break;
      }
      case OpKind::kDivide:
      case OpKind::kMultiply:
      case OpKind::kSubtractFrom: {
        // PyTorch multiplies (divides, subtracts) a float32 tensor and a
        // Python number rounded to float32.
        double constant = op.constant;
        if (!op.constant_field.empty()) {
          ASSIGN_OR_RETURN(constant,
                           config.Number(op.constant_field, op.constant));
        }
        planned.constant = static_cast<float>(constant);
        break;
      }
      case OpKind::kSinusoid: {
        // A row value's elements are embedded each, side by side: diffusers'
        // sinusoid of x.flatten() reshaped to [N, -1].
        if (in[0]->blocks > 0) {
          return absl::InternalError(
              absl::StrCat(family_->name, ": sinusoid of a stacked value"));
        }
        SinusoidParams& params = planned.sinusoid;
        params = op.sinusoid;
        if (params.dim_is_width) {
          params.dim = static_cast<int>(width_);
        } else if (!params.dim_field.empty()) {
          ASSIGN_OR_RETURN(const int64_t dim,
                           EvaluateConfig(config, params.dim_field));
          params.dim = static_cast<int>(dim);
        }
        if (!params.flip_field.empty()) {
          ASSIGN_OR_RETURN(params.flip_sin_to_cos,
                           config.Bool(params.flip_field, true));
        }
        if (!params.shift_field.empty()) {
          ASSIGN_OR_RETURN(params.downscale_freq_shift,
                           config.Number(params.shift_field, 0));
        }
        out.cols = params.dim * (in[0]->scalar ? 1 : in[0]->cols);
        out.scalar = false;
        break;
      }
      case OpKind::kConcat:
        out.cols = 0;  // a scalar is one column (Value::cols is 1)
        for (const Value* value : in) {
          if (value->blocks > 0) {
            return absl::InternalError(
                absl::StrCat(family_->name, ": concat of a stacked value"));
          }
          out.cols += value->cols;
        }
        out.scalar = false;
        break;
      case OpKind::kTableAdd: {
        if (in[0]->blocks > 0) {
          return absl::InternalError(
              absl::StrCat(family_->name, ": table add to a stacked value"));
        }
        std::vector<int64_t> shape = op.table_shape;
        shape.push_back(width_);
        int64_t table_width = 1;
        for (const int64_t dim : shape) table_width *= dim;
        if (table_width % in[0]->cols != 0) {
          return absl::InternalError(absl::StrCat(
              family_->name, ": ", op.weight, " holds ", table_width,
              " values, not a multiple of ", op.in[0], "'s ", in[0]->cols));
        }
        std::vector<int64_t> indices = {0};
        if (!op.blocks.empty()) {
          ASSIGN_OR_RETURN(const int64_t count,
                           EvaluateConfig(config, op.blocks));
          ASSIGN_OR_RETURN(indices, SelectBlocks(config, op, count));
          if (op.select != BlockSelect::kLast) {
            out.blocks = static_cast<int64_t>(indices.size());
          }
        }
        for (const int64_t block : indices) {
          const std::string name =
              absl::StrReplaceAll(op.weight, {{"{i}", absl::StrCat(block)}});
          if (op.weight_dtype == ValueDType::kModel && !dtype_known) {
            ASSIGN_OR_RETURN(dtype_, checkpoint.StoredDType(name));
            dtype_known = true;
          }
          const DType dtype =
              op.weight_dtype == ValueDType::kModel ? dtype_ : DType::kFloat32;
          ASSIGN_OR_RETURN(LoadedTensor table,
                           LoadAs(checkpoint, name, dtype, shape, convert));
          weight_bytes_ += static_cast<int64_t>(table.data.size());
          Fingerprint(name, dtype, table);
          std::vector<float> values(static_cast<size_t>(table_width));
          DecodeInto(reinterpret_cast<const char*>(table.data.data()),
                     table_width, dtype, values.data());
          planned.tables.push_back(std::move(values));
        }
        planned.in_width = in[0]->cols;
        planned.out_width = table_width;
        planned.blocks = static_cast<int64_t>(indices.size());
        out.cols = table_width * planned.blocks;
        out.scalar = false;
        break;
      }
      case OpKind::kEmbedding: {
        const auto index = std::find_if(
            family_->inputs.begin(), family_->inputs.end(),
            [&](const InputSpec& spec) { return spec.name == op.in[0]; });
        if (!in[0]->scalar || index == family_->inputs.end() ||
            op.table_shape.size() != 1 ||
            index->index_count != op.table_shape[0]) {
          return absl::InternalError(absl::StrCat(
              family_->name, ": ", op.out, " is not indexed by an input of ",
              op.table_shape.empty() ? 0 : op.table_shape[0], " indices"));
        }
        if (!dtype_known) {
          ASSIGN_OR_RETURN(dtype_, checkpoint.StoredDType(op.weight));
          dtype_known = true;
        }
        ASSIGN_OR_RETURN(LoadedTensor table,
                         LoadAs(checkpoint, op.weight, dtype_,
                                {op.table_shape[0], width_}, convert));
        weight_bytes_ += static_cast<int64_t>(table.data.size());
        Fingerprint(op.weight, dtype_, table);
        std::vector<float> values(
            static_cast<size_t>(op.table_shape[0] * width_));
        DecodeInto(reinterpret_cast<const char*>(table.data.data()),
                   static_cast<int64_t>(values.size()), dtype_, values.data());
        planned.tables.push_back(std::move(values));
        planned.in_width = 1;
        planned.out_width = width_;
        out.cols = width_;
        out.scalar = false;
        break;
      }
      case OpKind::kAdd:
        if (in[1]->cols != in[0]->cols) {
          return absl::InternalError(
              absl::StrCat(family_->name, ": add of unequal widths"));
        }
        break;
      case OpKind::kLinear: {
        if (in[0]->cols % planned.groups != 0 ||
            (planned.groups > 1 && !op.blocks.empty())) {
          return absl::InternalError(absl::StrCat(
              family_->name, ": linear ", op.out, " of ", planned.groups,
              " groups over a row of ", in[0]->cols));
        }
        planned.in_width = in[0]->cols / planned.groups;
        int64_t unit = width_ / op.width_div;
        if (!op.width_field.empty()) {
          ASSIGN_OR_RETURN(unit, EvaluateConfig(config, op.width_field));
        }
        planned.out_width = op.width_d * unit;
        std::vector<int64_t> indices = {0};  // unstacked: "{i}" is unused
        if (!op.blocks.empty()) {
          ASSIGN_OR_RETURN(const int64_t count,
                           EvaluateConfig(config, op.blocks));
          ASSIGN_OR_RETURN(indices, SelectBlocks(config, op, count));
          if (op.select != BlockSelect::kLast) {
            out.blocks = static_cast<int64_t>(indices.size());
          }
        }
        if (indices.empty()) break;
        planned.blocks = static_cast<int64_t>(indices.size());
        for (const int64_t block : indices) {
          const std::string prefix =
              absl::StrReplaceAll(op.weight, {{"{i}", absl::StrCat(block)}});
          if (op.weight_dtype == ValueDType::kModel && !dtype_known) {
            ASSIGN_OR_RETURN(dtype_,
                             checkpoint.StoredDType(prefix + ".weight"));
            dtype_known = true;
          }
          planned.weight_dtype =
              op.weight_dtype == ValueDType::kModel ? dtype_ : DType::kFloat32;
          ASSIGN_OR_RETURN(
              LoadedTensor weight,
              LoadAs(checkpoint, prefix + ".weight", planned.weight_dtype,
                     {planned.out_width, planned.in_width}, convert));
          LoadedTensor bias;  // empty: the Linear has none
          if (op.has_bias) {
            ASSIGN_OR_RETURN(
                bias, LoadAs(checkpoint, prefix + ".bias", planned.weight_dtype,
                             {planned.out_width}, convert));
          }
          weight_bytes_ +=
              static_cast<int64_t>(weight.data.size() + bias.data.size());
          Fingerprint(prefix + ".weight", planned.weight_dtype, weight);
          if (op.has_bias) {
            Fingerprint(prefix + ".bias", planned.weight_dtype, bias);
          }
          planned.weights.push_back(std::move(weight));
          planned.biases.push_back(std::move(bias));
        }
        out.cols = planned.out_width * planned.blocks * planned.groups;
        out.scalar = false;
        break;
      }
      default:
        break;
    }
    if ((op.kind == OpKind::kLinear && planned.weights.empty()) ||
        (op.kind == OpKind::kTableAdd && planned.tables.empty())) {
      absent.insert(op.out);
      continue;
    }
    value_info_[op.out] = out;
    ops_.push_back(std::move(planned));
  }
  for (const OutputSpec& output : family_->outputs) {
    if (!FlagHolds(*family_, config, output.when, &flag_status)) {
      RETURN_IF_ERROR(flag_status);
      continue;
    }
    if (absent.count(output.value) > 0) continue;
    outputs_.push_back(output);
    if (!output.chunks_field.empty()) {
      ASSIGN_OR_RETURN(outputs_.back().chunks,
                       EvaluateConfig(config, output.chunks_field));
    }
    if (value_info_.count(output.value) == 0) {
      return absl::InternalError(absl::StrCat(family_->name, ": output ",
                                              output.name, " has no value"));
    }
  }
  return absl::OkStatus();
}

absl::Status ConditioningModel::Run(
    const PlannedOp& planned, int64_t rows,
    std::map<std::string, std::vector<float>>* values) const {
  const Op& op = *planned.op;
  const std::vector<float>& in = values->at(op.in[0]);
  const Value& info = value_info_.at(op.out);
  std::vector<float> out(static_cast<size_t>(rows * info.cols));
  switch (op.kind) {
    case OpKind::kCast:
      for (size_t i = 0; i < out.size(); ++i) {
        out[i] = Rounded(in[i], op.dtype, dtype_);
      }
      break;
    case OpKind::kDivide:
      for (size_t i = 0; i < out.size(); ++i) {
        out[i] = Rounded(in[i] / planned.constant, op.dtype, dtype_);
      }
      break;
    case OpKind::kMultiply:
      for (size_t i = 0; i < out.size(); ++i) {
        out[i] = Rounded(in[i] * planned.constant, op.dtype, dtype_);
      }
      break;
    case OpKind::kSubtractFrom:
      for (size_t i = 0; i < out.size(); ++i) {
        out[i] = Rounded(planned.constant - in[i], op.dtype, dtype_);
      }
      break;
    case OpKind::kRange:
      for (int64_t row = 0; row < rows; ++row) {
        for (int64_t k = 0; k < info.cols; ++k) {
          out[row * info.cols + k] = Rounded(
              static_cast<float>(k) * planned.constant, op.dtype, dtype_);
        }
      }
      break;
    case OpKind::kRepeatBeside: {
      // Per row, per part: in[0]'s row, then the part of in[1].
      const std::vector<float>& parts = values->at(op.in[1]);
      const int64_t first = value_info_.at(op.in[0]).cols;
      const int64_t part = value_info_.at(op.in[1]).cols / planned.groups;
      float* to = out.data();
      for (int64_t row = 0; row < rows; ++row) {
        for (int64_t g = 0; g < planned.groups; ++g) {
          for (int64_t k = 0; k < first; ++k) {
            *to++ = Rounded(in[row * first + k], op.dtype, dtype_);
          }
          const float* from = parts.data() + (row * planned.groups + g) * part;
          for (int64_t k = 0; k < part; ++k) {
            *to++ = Rounded(from[k], op.dtype, dtype_);
          }
        }
      }
      break;
    }
    case OpKind::kRmsNorm: {
      // PyTorch's CPU rms_norm: the squares rounded to float32 and their
      // mean (a float32 sum here summed in double, then rounded), plus
      // float32's epsilon, rsqrt as 1 / sqrt; x * that, times the weight,
      // each product in float32, rounded once to dtype.
      const int64_t width = planned.in_width;
      const std::vector<float>& weight = planned.tables[0];
      const float epsilon = std::numeric_limits<float>::epsilon();
      for (int64_t part = 0; part < rows * planned.groups; ++part) {
        const float* x = in.data() + part * width;
        double sum = 0;
        for (int64_t k = 0; k < width; ++k) {
          sum += static_cast<double>(x[k] * x[k]);
        }
        const float mean = static_cast<float>(sum) / static_cast<float>(width);
        const float scale = 1.0f / std::sqrt(mean + epsilon);
        float* y = out.data() + part * width;
        for (int64_t k = 0; k < width; ++k) {
          y[k] = Rounded((x[k] * scale) * weight[k], op.dtype, dtype_);
        }
      }
      break;
    }
    case OpKind::kSilu:
      for (size_t i = 0; i < out.size(); ++i) {
        out[i] = Rounded(in[i] / (1.0f + std::exp(-in[i])), op.dtype, dtype_);
      }
      break;
    case OpKind::kAdd: {
      const std::vector<float>& other = values->at(op.in[1]);
      for (size_t i = 0; i < out.size(); ++i) {
        out[i] = Rounded(in[i] + other[i], op.dtype, dtype_);
      }
      break;
    }
    case OpKind::kConcat: {
      // Row by row, each input's columns in turn; every element is rounded
      // to dtype (a no-op for inputs already there).
      int64_t offset = 0;
      for (const std::string& name : op.in) {
        const int64_t cols = value_info_.at(name).cols;
        const std::vector<float>& data = values->at(name);
        for (int64_t row = 0; row < rows; ++row) {
          for (int64_t col = 0; col < cols; ++col) {
            out[row * info.cols + offset + col] =
                Rounded(data[row * cols + col], op.dtype, dtype_);
          }
        }
        offset += cols;
      }
      break;
    }
    case OpKind::kSinusoid: {
      EmbeddingSpec spec;
      spec.dim = planned.sinusoid.dim;
      spec.flip_sin_to_cos = planned.sinusoid.flip_sin_to_cos;
      spec.downscale_freq_shift = planned.sinusoid.downscale_freq_shift;
      spec.scale = planned.sinusoid.scale;
      spec.max_period = planned.sinusoid.max_period;
      spec.dtype = DType::kFloat32;
      RETURN_IF_ERROR(ValidateRequest(spec, in, Limits()));
      RETURN_IF_ERROR(sinusoid_backend_->Compute(
          spec, in,
          absl::MakeSpan(reinterpret_cast<uint8_t*>(out.data()),
                         out.size() * sizeof(float))));
      break;
    }
    case OpKind::kLinear: {
      const DType out_dtype =
          op.dtype == ValueDType::kModel ? dtype_ : DType::kFloat32;
      // A row of `groups` inputs is `groups` rows of the Linear.
      const int64_t row_width = planned.out_width * planned.groups;
      std::vector<float> block_out(static_cast<size_t>(rows * row_width));
      for (int64_t block = 0; block < planned.blocks; ++block) {
        if (options_.linear_engine != nullptr) {
          RETURN_IF_ERROR(options_.linear_engine->Forward(
              planned.engine_ids[block], in, rows * planned.groups, out_dtype,
              absl::MakeSpan(block_out)));
        } else {
          LinearParams params;
          params.weight = planned.weights[block].data;
          params.bias = planned.biases[block].data;
          params.dtype = planned.weight_dtype;
          params.in_features = planned.in_width;
          params.out_features = planned.out_width;
          RETURN_IF_ERROR(LinearForward(params, in, rows * planned.groups,
                                        out_dtype, options_.threads,
                                        absl::MakeSpan(block_out)));
        }
        // [N, W] of block `block` into [N, L, W].
        for (int64_t row = 0; row < rows; ++row) {
          std::copy_n(block_out.data() + row * row_width, row_width,
                      out.data() + row * info.cols + block * row_width);
        }
      }
      break;
    }
    case OpKind::kEmbedding: {
      // The index was checked against the table's rows with the inputs.
      const int64_t width = planned.out_width;
      for (int64_t row = 0; row < rows; ++row) {
        const float* picked =
            planned.tables[0].data() + static_cast<int64_t>(in[row]) * width;
        for (int64_t j = 0; j < width; ++j) {
          out[row * width + j] = Rounded(picked[j], op.dtype, dtype_);
        }
      }
      break;
    }
    case OpKind::kTableAdd: {
      const int64_t width = planned.out_width;
      for (int64_t row = 0; row < rows; ++row) {
        const float* x = in.data() + row * planned.in_width;
        for (int64_t block = 0; block < planned.blocks; ++block) {
          const std::vector<float>& table = planned.tables[block];
          float* y = out.data() + row * info.cols + block * width;
          for (int64_t j = 0; j < width; ++j) {
            y[j] =
                Rounded(x[j % planned.in_width] + table[j], op.dtype, dtype_);
          }
        }
      }
      break;
    }
  }
  (*values)[op.out] = std::move(out);
  return absl::OkStatus();
}

std::vector<InputInfo> ConditioningModel::inputs() const {
  std::vector<InputInfo> infos;
  for (const InputSpec& input : inputs_) {
    const Value& value = value_info_.at(input.name);
    infos.push_back({input.name, value.scalar ? 0 : value.cols, input.help});
  }
  return infos;
}

std::vector<OutputInfo> ConditioningModel::outputs() const {
  std::vector<OutputInfo> infos;
  for (const OutputSpec& output : outputs_) {
    const Value& value = value_info_.at(output.value);
    OutputInfo info;
    info.name = output.name;
    info.dtype = value.dtype == ValueDType::kModel ? dtype_ : DType::kFloat32;
    if (value.blocks > 0) {
      info.row_shape = {value.blocks, value.cols / value.blocks};
    } else if (!value.scalar) {
      info.row_shape = {value.cols};
    }
    info.row_bytes = (value.scalar ? 1 : value.cols) * DTypeSize(info.dtype);
    info.layout = output.layout;
    infos.push_back(std::move(info));
  }
  return infos;
}

int64_t ConditioningModel::working_bytes_per_row() const {
  int64_t bytes = 0;
  for (const auto& [name, value] : value_info_) {
    bytes += (value.scalar ? 1 : value.cols) * int64_t{sizeof(float)};
  }
  return bytes;
}

const std::vector<float>& ConditioningInputs::Get(
    const std::string& name) const {
  static const std::vector<float> kNone;
  const auto found = values.find(name);
  return found == values.end() ? kNone : found->second;
}

absl::StatusOr<std::vector<ConditioningOutput>> ConditioningModel::Compute(
    const ConditioningInputs& inputs,
    const std::vector<std::string>& names) const {
  // (Not a structured binding: C++17 lambdas cannot capture one.)
  for (const auto& entry : inputs.values) {
    const std::string& name = entry.first;
    if (!entry.second.empty() &&
        !std::any_of(
            family_->inputs.begin(), family_->inputs.end(),
            [&](const InputSpec& spec) { return spec.name == name; })) {
      std::vector<std::string> known;
      for (const InputSpec& spec : family_->inputs) known.push_back(spec.name);
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": not an input of ", family_->name, " (",
                       absl::StrJoin(known, ", "), ")"));
    }
  }
  const int64_t rows = static_cast<int64_t>(inputs.Get("t").size());
  if (rows < 1) {
    return absl::InvalidArgumentError("t: at least one timestep is required");
  }
  if (rows > kMaxConditioningRows) {
    return absl::ResourceExhaustedError(
        absl::StrCat("t: ", rows, " timesteps is above the limit of ",
                     kMaxConditioningRows));
  }
  // Inputs, broadcast to N rows and checked.
  std::map<std::string, std::vector<float>> values;
  auto take = [&](const InputSpec& spec,
                  const std::vector<float>& given) -> absl::Status {
    const std::string& name = spec.name;
    const auto info = value_info_.find(name);
    if (info == value_info_.end()) {
      if (!given.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            name, ": ", family_->name, " model ",
            "does not take this input (see its config.json flags)"));
      }
      return absl::OkStatus();
    }
    const int64_t cols = info->second.cols;
    if (given.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": required by this ", family_->name, " model, not given"));
    }
    if (static_cast<int64_t>(given.size()) != rows * cols &&
        static_cast<int64_t>(given.size()) != cols) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": expected ", cols, " or ", rows * cols, " values (", rows,
          " rows of ", cols, "), got ", given.size()));
    }
    for (size_t i = 0; i < given.size(); ++i) {
      if (!std::isfinite(given[i])) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, "[", i, "] must be finite, got ", given[i]));
      }
      if (spec.index_count > 0 &&
          (given[i] != std::floor(given[i]) || given[i] < 0 ||
           given[i] >= static_cast<float>(spec.index_count))) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, "[", i, "] must be an integer in [0, ",
                         spec.index_count, "), got ", given[i]));
      }
    }
    std::vector<float>& value = values[name];
    value.resize(static_cast<size_t>(rows * cols));
    for (int64_t row = 0; row < rows; ++row) {
      const float* src =
          given.data() +
          (static_cast<int64_t>(given.size()) == cols ? 0 : row * cols);
      std::copy_n(src, cols, value.data() + row * cols);
    }
    return absl::OkStatus();
  };
  for (const InputSpec& input : family_->inputs) {
    RETURN_IF_ERROR(take(input, inputs.Get(input.name)));
  }

  // Outputs asked for, and the ops they need.  Besides the family's
  // outputs, any computed value can be asked for by its name in the
  // description: tests compare each op with diffusers' own module that way.
  std::vector<OutputSpec> wanted;
  for (const OutputSpec& output : outputs_) {
    if (names.empty() ||
        std::find(names.begin(), names.end(), output.name) != names.end()) {
      wanted.push_back(output);
    }
  }
  for (const std::string& name : names) {
    if (std::any_of(outputs_.begin(), outputs_.end(),
                    [&](const OutputSpec& o) { return o.name == name; })) {
      continue;
    }
    const auto value = value_info_.find(name);
    if (value == value_info_.end() || value->second.producer < 0) {
      std::vector<std::string> known;
      for (const OutputSpec& o : outputs_) known.push_back(o.name);
      return absl::InvalidArgumentError(
          absl::StrCat("outputs: ", Quoted(name), " is not an output of ",
                       family_->name, " (", absl::StrJoin(known, ", "),
                       ") nor a value of its description"));
    }
    wanted.push_back(OutputSpec{name, name, ""});
  }
  std::vector<bool> needed(ops_.size(), false);
  std::set<std::string> wanted_values;
  std::vector<std::string> stack;
  for (const OutputSpec& output : wanted) {
    wanted_values.insert(output.value);
    stack.push_back(output.value);
  }
  while (!stack.empty()) {
    const std::string name = stack.back();
    stack.pop_back();
    const int producer = value_info_.at(name).producer;
    if (producer < 0 || needed[producer]) continue;
    needed[producer] = true;
    for (const std::string& in : ops_[producer].op->in) stack.push_back(in);
  }

  // Split: scalars (cheap, always computed), row values of t and guidance
  // alone (cached), and the rest.  The frontier is the set of cached
  // values something later or the caller reads.
  auto is_scalar = [&](const PlannedOp& op) {
    return value_info_.at(op.op->out).scalar;
  };
  uint32_t row_inputs = 0;  // inputs such as the pooled embedding
  for (const InputSpec& input : family_->inputs) {
    if (!input.width_field.empty()) {
      row_inputs |= InputBit(family_->inputs, input.name);
    }
  }
  auto t_only = [&](const std::string& name) {
    const Value& info = value_info_.at(name);
    return !info.scalar && (info.depends & row_inputs) == 0 &&
           info.depends != 0;
  };
  for (size_t i = 0; i < ops_.size(); ++i) {
    if (needed[i] && is_scalar(ops_[i]))
      RETURN_IF_ERROR(Run(ops_[i], rows, &values));
  }
  std::vector<std::string> frontier;
  std::set<std::string> key_scalars;
  for (size_t i = 0; i < ops_.size(); ++i) {
    if (!needed[i]) continue;
    const Op& op = *ops_[i].op;
    if (t_only(op.out)) {
      for (const std::string& in : op.in) {
        if (value_info_.at(in).scalar) key_scalars.insert(in);
      }
      bool read_later = wanted_values.count(op.out) > 0;
      for (size_t j = i + 1; j < ops_.size(); ++j) {
        if (!needed[j] || t_only(ops_[j].op->out)) continue;
        const auto& ins = ops_[j].op->in;
        if (std::find(ins.begin(), ins.end(), op.out) != ins.end()) {
          read_later = true;
        }
      }
      if (read_later) frontier.push_back(op.out);
    }
  }

  // One key per row: the model, the cached values' names and the exact
  // bits of the scalars the cached values are computed from.
  const std::string key_prefix =
      absl::StrCat(cache_key_, "|", absl::StrJoin(frontier, ","), "|");
  std::vector<std::string> keys(rows);
  for (int64_t row = 0; row < rows; ++row) {
    keys[row] = key_prefix;
    for (const std::string& name : key_scalars) {
      keys[row].append(reinterpret_cast<const char*>(&values[name][row]), 4);
    }
  }
  absl::flat_hash_map<std::string, std::shared_ptr<const std::string>> found;
  std::vector<int64_t> to_compute;  // one row per distinct missing key
  for (int64_t row = 0; row < rows; ++row) {
    if (found.contains(keys[row])) continue;
    std::shared_ptr<const std::string> hit =
        options_.cache != nullptr && !frontier.empty()
            ? options_.cache->Find(keys[row])
            : nullptr;
    if (hit == nullptr) to_compute.push_back(row);
    found[keys[row]] = std::move(hit);
  }
  if (!frontier.empty() && !to_compute.empty()) {
    // The missing rows alone: the kernels are batch-invariant, so these are
    // the bits a full batch would give.
    const int64_t m = static_cast<int64_t>(to_compute.size());
    std::map<std::string, std::vector<float>> sub;
    for (const std::string& name : key_scalars) {
      std::vector<float>& column = sub[name];
      for (int64_t row : to_compute) column.push_back(values[name][row]);
    }
    for (size_t i = 0; i < ops_.size(); ++i) {
      if (needed[i] && t_only(ops_[i].op->out)) {
        RETURN_IF_ERROR(Run(ops_[i], m, &sub));
      }
    }
    for (int64_t j = 0; j < m; ++j) {
      auto bytes = std::make_shared<std::string>();
      for (const std::string& name : frontier) {
        const Value& info = value_info_.at(name);
        const DType dtype =
            info.dtype == ValueDType::kModel ? dtype_ : DType::kFloat32;
        AppendEncoded(sub[name].data() + j * info.cols, info.cols, dtype,
                      bytes.get());
      }
      const std::string& key = keys[to_compute[j]];
      if (options_.cache != nullptr) options_.cache->Insert(key, bytes);
      found[key] = std::move(bytes);
    }
  }
  for (const std::string& name : frontier) {
    values[name].resize(static_cast<size_t>(rows * value_info_.at(name).cols));
  }
  // With nothing cached (only scalars, or only values of the pooled
  // embedding asked for) there are no entries to unpack.
  for (int64_t row = 0; row < rows && !frontier.empty(); ++row) {
    const std::string& bytes = *found.at(keys[row]);
    size_t offset = 0;
    for (const std::string& name : frontier) {
      const Value& info = value_info_.at(name);
      const DType dtype =
          info.dtype == ValueDType::kModel ? dtype_ : DType::kFloat32;
      DecodeInto(bytes.data() + offset, info.cols, dtype,
                 values[name].data() + row * info.cols);
      offset += static_cast<size_t>(info.cols) * DTypeSize(dtype);
    }
  }
  for (size_t i = 0; i < ops_.size(); ++i) {
    if (needed[i] && !is_scalar(ops_[i]) && !t_only(ops_[i].op->out)) {
      RETURN_IF_ERROR(Run(ops_[i], rows, &values));
    }
  }

  std::vector<ConditioningOutput> outputs;
  for (const OutputSpec& spec : wanted) {
    const Value& info = value_info_.at(spec.value);
    ConditioningOutput output;
    output.name = spec.name;
    output.dtype = info.dtype == ValueDType::kModel ? dtype_ : DType::kFloat32;
    output.shape = {rows};
    if (info.blocks > 0) {
      output.shape.push_back(info.blocks);
      output.shape.push_back(info.cols / info.blocks);
    } else if (!info.scalar) {
      output.shape.push_back(info.cols);
    }
    if (spec.chunks > 0 && !info.scalar) {
      output.shape.back() /= spec.chunks;
      output.shape.insert(output.shape.end() - 1, spec.chunks);
    }
    const std::vector<float>& data = values.at(spec.value);
    AppendEncoded(data.data(), static_cast<int64_t>(data.size()), output.dtype,
                  &output.data);
    outputs.push_back(std::move(output));
  }
  return outputs;
}

}  // namespace temb::models
