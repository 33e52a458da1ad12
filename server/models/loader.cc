// Loading a conditioning model: config.json picks the family, the family's
// description is checked against the config, and each op's plan step
// (op_unit.h) sizes its values and reads its tensors, and only those.
#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "config_expression.h"
#include "model_graph.h"
#include "op_unit.h"
#include "temb/base/quoted.h"
#include "temb/base/status_macros.h"
#include "temb/kernels/cpu_backend.h"
#include "temb/kernels/linear.h"
#include "temb/models/conditioning_model.h"
#include "tensor_reader.h"

namespace temb::models {
namespace {

// The family's requirements and unsupported flags against the config;
// returns the width D.
absl::StatusOr<int64_t> CheckConfig(const FamilyDescription& family,
                                    const Checkpoint& checkpoint) {
  const ModelConfig& config = checkpoint.config();
  for (const ConfigRequirement& requirement : family.requirements) {
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
  int64_t width = 1;
  for (const std::string& field : family.width_fields) {
    ASSIGN_OR_RETURN(const int64_t factor, EvaluateConfig(config, field));
    width *= factor;
  }
  for (const std::string& flag : family.unsupported_flags) {
    ASSIGN_OR_RETURN(const bool set, config.Bool(flag, false));
    if (set) {
      return absl::InvalidArgumentError(
          absl::StrCat(checkpoint.dir(), "/", kConfigFile, ": field ", flag,
                       ": true is not supported for ", family.name, " yet"));
    }
  }
  return width;
}

int AddValue(ModelGraph& graph, const std::string& name, ValueInfo value) {
  const int slot = static_cast<int>(graph.values.size());
  graph.names.push_back(name);
  graph.values.push_back(value);
  graph.slots[name] = slot;
  return slot;
}

// The inputs whose condition holds, each a value of its own.
absl::Status AddInputs(const FamilyDescription& family,
                       const ModelConfig& config, ModelGraph& graph) {
  for (size_t i = 0; i < family.inputs.size(); ++i) {
    const InputSpec& input = family.inputs[i];
    ASSIGN_OR_RETURN(const bool holds,
                     ConditionHolds(family, config, input.when));
    if (!holds) continue;
    if (!input.stands_for.empty()) {  // its slot is the value's (AddOps)
      graph.input_slots.push_back(-1);
      graph.inputs.push_back(input);
      continue;
    }
    ValueInfo value;
    value.depends = 1u << i;
    if (!input.width_field.empty()) {
      ASSIGN_OR_RETURN(value.cols, EvaluateConfig(config, input.width_field));
      value.scalar = false;
      graph.row_inputs |= value.depends;
    }
    graph.input_slots.push_back(AddValue(graph, input.name, value));
    graph.inputs.push_back(input);
  }
  return absl::OkStatus();
}

// The ops whose condition holds, planned in order.  An op over an empty
// block selection leaves its value out: `absent` names them.
absl::Status AddOps(const FamilyDescription& family, const ModelConfig& config,
                    int64_t width, TensorReader& tensors, ModelGraph& graph,
                    std::set<std::string>& absent) {
  for (const Op& op : family.ops) {
    ASSIGN_OR_RETURN(const bool holds, ConditionHolds(family, config, op.when));
    if (!holds) continue;
    PlanContext context{family, config, width, tensors, {}};
    std::vector<int> in;
    for (const std::string& name : op.in) {
      const int slot = graph.SlotOf(name);
      if (slot < 0) {
        return absl::InternalError(absl::StrCat(
            family.name, ": op ", op.out, " reads undefined value ", name));
      }
      in.push_back(slot);
      context.in.push_back(&graph.values[slot]);
    }
    ASSIGN_OR_RETURN(OpPlan plan, PlanOp(op, context));
    if (plan.planned == nullptr) {
      absent.insert(op.out);
      continue;
    }
    PlannedOp& planned = *plan.planned;
    planned.op = &op;
    planned.in = std::move(in);
    for (const ValueInfo* value : context.in) {
      planned.in_cols.push_back(value->cols);
    }
    planned.out_cols = plan.out.cols;
    plan.out.producer = static_cast<int>(graph.ops.size());
    // A later op of the same name (a condition's alternative) takes the
    // name; the earlier value keeps its slot for the ops that read it.
    planned.out = AddValue(graph, op.out, plan.out);
    graph.ops.push_back(std::move(plan.planned));
  }
  return absl::OkStatus();
}

// An input that stands for a computed value gives that value's slot, and
// replaces the one input that value is computed from: with it given and
// that input not, every output must still be computable (no op it needs
// may read the replaced input but through that value).
absl::Status ResolveStandIns(const FamilyDescription& family,
                             ModelGraph& graph) {
  for (size_t i = 0; i < graph.inputs.size(); ++i) {
    InputSpec& input = graph.inputs[i];
    if (input.stands_for.empty()) continue;
    const int slot = graph.SlotOf(input.stands_for);
    if (slot < 0 || graph.values[slot].producer < 0 ||
        !graph.values[slot].scalar) {
      return absl::InternalError(
          absl::StrCat(family.name, ": input ", input.name, " stands for ",
                       input.stands_for, ", not a computed [N] value"));
    }
    // The one family input the value is computed from.
    const uint32_t depends = graph.values[slot].depends;
    for (size_t bit = 0; bit < family.inputs.size(); ++bit) {
      if (depends == (1u << bit)) input.instead_of = family.inputs[bit].name;
    }
    if (input.instead_of.empty()) {
      return absl::InternalError(
          absl::StrCat(family.name, ": input ", input.name, " stands for ",
                       input.stands_for, ", not a value of one input"));
    }
    graph.input_slots[i] = slot;
    std::vector<bool> provided(graph.values.size(), false);
    provided[slot] = true;
    const int replaced = graph.SlotOf(input.instead_of);
    const std::vector<bool> needed = graph.OpsFor(graph.output_slots, provided);
    for (size_t op = 0; op < graph.ops.size(); ++op) {
      const std::vector<int>& in = graph.ops[op]->in;
      if (needed[op] && std::find(in.begin(), in.end(), replaced) != in.end()) {
        return absl::InternalError(absl::StrCat(
            family.name, ": op ", graph.names[graph.ops[op]->out], " reads ",
            input.instead_of, ", which input ", input.name, " replaces"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status AddOutputs(const FamilyDescription& family,
                        const ModelConfig& config,
                        const std::set<std::string>& absent,
                        ModelGraph& graph) {
  for (const OutputSpec& output : family.outputs) {
    ASSIGN_OR_RETURN(const bool holds,
                     ConditionHolds(family, config, output.when));
    if (!holds || absent.count(output.value) > 0) continue;
    graph.outputs.push_back(output);
    if (!output.chunks_field.empty()) {
      ASSIGN_OR_RETURN(graph.outputs.back().chunks,
                       EvaluateConfig(config, output.chunks_field));
    }
    const int slot = graph.SlotOf(output.value);
    if (slot < 0) {
      return absl::InternalError(
          absl::StrCat(family.name, ": output ", output.name, " has no value"));
    }
    graph.output_slots.push_back(slot);
  }
  for (const FoldedModule& folded : family.folded) {
    ASSIGN_OR_RETURN(const bool holds,
                     ConditionHolds(family, config, folded.when));
    if (holds) graph.folded.push_back(folded);
  }
  return absl::OkStatus();
}

absl::Status UnknownFamily(const std::string& dir,
                           const Checkpoint& checkpoint) {
  std::vector<std::string> known;
  for (const FamilyDescription& f : Families()) known.push_back(f.class_name);
  return absl::InvalidArgumentError(absl::StrCat(
      dir, "/", kConfigFile,
      ": field _class_name: ", Quoted(checkpoint.config().class_name()),
      " is not a supported family (supported: ", absl::StrJoin(known, ", "),
      ")"));
}

}  // namespace

ConditioningModel::~ConditioningModel() = default;

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
  if (family == nullptr) return UnknownFamily(dir, *checkpoint);
  std::unique_ptr<ConditioningModel> model(new ConditioningModel());
  model->family_ = family;
  model->options_ = options;
  model->sinusoid_backend_ = CreateCpuBackend(options.threads);
  // The option wins over the folder's file: a command line overrides what
  // the folder says.
  model->torch_dtype_ = options.torch_dtype.has_value()
                            ? options.torch_dtype
                            : folder_options.torch_dtype;
  ASSIGN_OR_RETURN(model->width_, CheckConfig(*family, *checkpoint));
  auto graph = std::make_unique<ModelGraph>();
  TensorReader tensors(*checkpoint, model->torch_dtype_, options.cancelled,
                       options.deadline);
  const ModelConfig& config = checkpoint->config();
  std::set<std::string> absent;  // values over an empty block selection
  RETURN_IF_ERROR(AddInputs(*family, config, *graph));
  RETURN_IF_ERROR(
      AddOps(*family, config, model->width_, tensors, *graph, absent));
  RETURN_IF_ERROR(AddOutputs(*family, config, absent, *graph));
  RETURN_IF_ERROR(ResolveStandIns(*family, *graph));
  model->dtype_ = tensors.model_dtype();
  model->weight_bytes_ = tensors.weight_bytes();
  model->weight_fingerprints_ = tensors.fingerprints();
  for (auto& [field, text] : config.ReadFields()) {
    if (text.size() <= kMaxPublishedConfigBytes) {
      model->config_fields_.emplace(field, std::move(text));
    }
  }
  model->linear_engine_ = options.linear_engine != nullptr
                              ? options.linear_engine
                              : CreateCpuLinearEngine(options.threads);
  for (const std::unique_ptr<PlannedOp>& op : graph->ops) {
    RETURN_IF_ERROR(op->Upload(*model->linear_engine_));
  }
  model->graph_ = std::move(graph);
  // Rows summed by another engine may round differently: never shared.  The
  // torch_dtype is part of the weights' identity: the same files converted
  // are other weights than the same files as stored.
  model->cache_key_ = absl::StrCat(
      family->name, "|", DTypeName(model->dtype_), "|torch_dtype:",
      model->torch_dtype_.has_value() ? DTypeName(*model->torch_dtype_)
                                      : "stored",
      "|", checkpoint->weights_identity(), "|",
      // The bytes themselves, sampled: a folder replaced by files of the
      // same names, sizes and times is still other weights.
      absl::Hash<std::map<std::string, std::string>>{}(
          model->weight_fingerprints_),
      "|", model->linear_engine_->name());
  return model;
}

}  // namespace temb::models
