// Computing a loaded model's outputs: the inputs are checked and broadcast
// into their slots, the ops the asked-for values need are found, and they
// run in the cache policy's groups (cache_policy.h).
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "cache_policy.h"
#include "model_graph.h"
#include "temb/base/quoted.h"
#include "temb/base/status_macros.h"
#include "temb/kernels/linear.h"
#include "temb/models/conditioning_model.h"
#include "value_codec.h"

namespace temb::models {
namespace {

// Every given input is one the family takes.
absl::Status CheckInputNames(const FamilyDescription& family,
                             const ConditioningInputs& inputs) {
  for (const auto& [name, given] : inputs.values) {
    if (given.empty()) continue;
    const bool known = std::any_of(
        family.inputs.begin(), family.inputs.end(),
        [&name = name](const InputSpec& spec) { return spec.name == name; });
    if (known) continue;
    std::vector<std::string> names;
    for (const InputSpec& spec : family.inputs) names.push_back(spec.name);
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": not an input of ", family.name, " (",
                     absl::StrJoin(names, ", "), ")"));
  }
  return absl::OkStatus();
}

// `given` checked (finite, an index where it is one) and broadcast to
// `rows` rows of `cols` into `value`.
absl::Status TakeInput(const FamilyDescription& family, const InputSpec& spec,
                       int64_t rows, int64_t cols,
                       const std::vector<float>& given,
                       std::vector<float>& value) {
  const std::string& name = spec.name;
  if (given.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": required by this ", family.name, " model, not given"));
  }
  const int64_t count = static_cast<int64_t>(given.size());
  if (count != rows * cols && count != cols) {
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
  value.resize(static_cast<size_t>(rows * cols));
  for (int64_t row = 0; row < rows; ++row) {
    const float* src = given.data() + (count == cols ? 0 : row * cols);
    std::copy_n(src, cols, value.data() + row * cols);
  }
  return absl::OkStatus();
}

// The input that sets a call's rows: "t", or one standing for a value
// computed from it (the forward's timestep), exactly one of them given.
// An input standing for a value is never given with the input it replaces.
absl::StatusOr<std::string> TimeInput(const FamilyDescription& family,
                                      const ModelGraph& graph,
                                      const ConditioningInputs& inputs) {
  std::string time = "t";
  for (const InputSpec& spec : graph.inputs) {
    if (spec.stands_for.empty() || inputs.Get(spec.name).empty()) continue;
    if (!inputs.Get(spec.instead_of).empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          spec.name, ": given with ", spec.instead_of, "; ", family.name,
          " takes ", spec.instead_of, " or ", spec.name, ", not both"));
    }
    if (spec.instead_of != "t") continue;
    if (time != "t") {
      return absl::InvalidArgumentError(absl::StrCat(spec.name, ": given with ",
                                                     time, "; ", family.name,
                                                     " takes one of them"));
    }
    time = spec.name;
  }
  return time;
}

// Whether an input is left out because an input standing for a value
// computed from it is given.
bool StoodIn(const ModelGraph& graph, const ConditioningInputs& inputs,
             const std::string& name) {
  return std::any_of(
      graph.inputs.begin(), graph.inputs.end(), [&](const InputSpec& a) {
        return a.instead_of == name && !inputs.Get(a.name).empty();
      });
}

// The inputs into their slots; one the model does not take (its condition
// does not hold) must not be given.  An input standing for a value fills
// that value's slot, marked in `provided`, each element checked to be one
// of the value's dtype (the transformer hands it so).
absl::Status TakeInputs(const FamilyDescription& family,
                        const ModelGraph& graph,
                        const ConditioningInputs& inputs, int64_t rows,
                        DType model_dtype, Values& values,
                        std::vector<bool>& provided) {
  for (const InputSpec& spec : family.inputs) {
    const std::vector<float>& given = inputs.Get(spec.name);
    const auto active =
        std::find_if(graph.inputs.begin(), graph.inputs.end(),
                     [&](const InputSpec& a) { return a.name == spec.name; });
    if (active == graph.inputs.end()) {
      if (given.empty()) continue;
      return absl::InvalidArgumentError(
          absl::StrCat(spec.name, ": ", family.name, " model ",
                       "does not take this input (see its config.json flags)"));
    }
    const bool stands_in = !spec.stands_for.empty();
    if ((stands_in && given.empty()) || StoodIn(graph, inputs, spec.name)) {
      continue;
    }
    const int slot = graph.input_slots[active - graph.inputs.begin()];
    RETURN_IF_ERROR(TakeInput(family, spec, rows, graph.values[slot].cols,
                              given, values[slot]));
    if (!stands_in) continue;
    provided[slot] = true;
    const DType dtype = ModelGraph::DTypeOf(graph.values[slot], model_dtype);
    for (size_t i = 0; i < values[slot].size(); ++i) {
      const float value = values[slot][i];
      if (RoundToDType(value, dtype) != value) {
        return absl::InvalidArgumentError(absl::StrCat(
            spec.name, "[", i, "] = ", value, " is not a ", DTypeName(dtype),
            " value, as this ", family.name, " model receives it"));
      }
    }
  }
  return absl::OkStatus();
}

// What a call returns: an output of the model's, or any value its
// description computes, asked for by name (the tests compare each op
// with diffusers' own module that way).
struct Wanted {
  OutputSpec spec;
  int slot = -1;
};

absl::StatusOr<std::vector<Wanted>> WantedOutputs(
    const FamilyDescription& family, const ModelGraph& graph,
    const std::vector<std::string>& names) {
  std::vector<Wanted> wanted;
  std::vector<std::string> known;
  for (size_t i = 0; i < graph.outputs.size(); ++i) {
    const OutputSpec& output = graph.outputs[i];
    known.push_back(output.name);
    if (names.empty() ||
        std::find(names.begin(), names.end(), output.name) != names.end()) {
      wanted.push_back({output, graph.output_slots[i]});
    }
  }
  for (const std::string& name : names) {
    if (std::find(known.begin(), known.end(), name) != known.end()) continue;
    const int slot = graph.SlotOf(name);
    if (slot < 0 || graph.values[slot].producer < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "outputs: ", Quoted(name), " is not an output of ", family.name, " (",
          absl::StrJoin(known, ", "), ") nor a value of its description"));
    }
    wanted.push_back({OutputSpec{name, name, ""}, slot});
  }
  return wanted;
}

ConditioningOutput Encode(const Wanted& wanted, const ModelGraph& graph,
                          DType model_dtype, int64_t rows,
                          const Values& values) {
  const ValueInfo& info = graph.values[wanted.slot];
  ConditioningOutput output;
  output.name = wanted.spec.name;
  output.dtype = ModelGraph::DTypeOf(info, model_dtype);
  output.shape = {rows};
  if (info.blocks > 0) {
    output.shape.push_back(info.blocks);
    output.shape.push_back(info.cols / info.blocks);
  } else if (!info.scalar) {
    output.shape.push_back(info.cols);
  }
  if (wanted.spec.chunks > 0 && !info.scalar) {
    output.shape.back() /= wanted.spec.chunks;
    output.shape.insert(output.shape.end() - 1, wanted.spec.chunks);
  }
  const std::vector<float>& data = values[wanted.slot];
  AppendEncoded(data.data(), static_cast<int64_t>(data.size()), output.dtype,
                &output.data);
  return output;
}

// OutputInfo's replaces, replaced_kind, blocks and input_module of output
// `i`: the embedder its spec names, else the module of the Linear or the
// table of the table add computing it.
void DescribeReplaced(const ModelGraph& graph, size_t i, OutputInfo& info) {
  const OutputSpec& spec = graph.outputs[i];
  if (!spec.replaces.empty()) {
    info.replaces = spec.replaces;
    info.replaced_kind = "embedder";
    return;
  }
  const ValueInfo& value = graph.values[graph.output_slots[i]];
  if (value.producer < 0) return;
  const PlannedOp& planned = *graph.ops[value.producer];
  const Op& op = *planned.op;
  if (op.kind != OpKind::kLinear && op.kind != OpKind::kTableAdd) return;
  info.replaced_kind = op.kind == OpKind::kLinear ? "linear" : "table";
  info.replaces = op.weight;
  info.input_module = op.input_module;
  info.embedding = spec.embedding;
  if (value.blocks > 0) {
    info.blocks = planned.block_indices;
    return;
  }
  // One block of a stacked description (SD3's last context norm), or a
  // module of its own: named as it is.
  const std::string block = absl::StrCat(planned.block_indices.front());
  info.replaces = absl::StrReplaceAll(info.replaces, {{"{i}", block}});
  info.input_module = absl::StrReplaceAll(info.input_module, {{"{i}", block}});
}

}  // namespace

const std::vector<float>& ConditioningInputs::Get(
    const std::string& name) const {
  static const std::vector<float> kNone;
  const auto found = values.find(name);
  return found == values.end() ? kNone : found->second;
}

const std::vector<InputSpec>& ConditioningModel::active_inputs() const {
  return graph_->inputs;
}

std::vector<InputInfo> ConditioningModel::inputs() const {
  std::vector<InputInfo> infos;
  for (size_t i = 0; i < graph_->inputs.size(); ++i) {
    const ValueInfo& value = graph_->values[graph_->input_slots[i]];
    const InputSpec& spec = graph_->inputs[i];
    infos.push_back({spec.name, value.scalar ? 0 : value.cols, spec.help,
                     spec.stands_for, spec.instead_of, spec.module,
                     spec.argument, spec.in_model_dtype});
  }
  return infos;
}

std::vector<OutputInfo> ConditioningModel::outputs() const {
  std::vector<OutputInfo> infos;
  for (size_t i = 0; i < graph_->outputs.size(); ++i) {
    const ValueInfo& value = graph_->values[graph_->output_slots[i]];
    OutputInfo info;
    info.name = graph_->outputs[i].name;
    info.dtype = ModelGraph::DTypeOf(value, dtype_);
    if (value.blocks > 0) {
      info.row_shape = {value.blocks, value.cols / value.blocks};
    } else if (!value.scalar) {
      info.row_shape = {value.cols};
    }
    info.row_bytes = (value.scalar ? 1 : value.cols) * DTypeSize(info.dtype);
    info.layout = graph_->outputs[i].layout;
    DescribeReplaced(*graph_, i, info);
    infos.push_back(std::move(info));
  }
  return infos;
}

std::vector<std::string> ConditioningModel::embedder_results() const {
  std::vector<std::string> results;
  for (const std::string& name : family_->embedder_results) {
    const bool present = std::any_of(
        graph_->outputs.begin(), graph_->outputs.end(),
        [&](const OutputSpec& output) { return output.name == name; });
    results.push_back(present ? name : "");
  }
  return results;
}

std::vector<FoldedModuleInfo> ConditioningModel::folded_modules() const {
  std::vector<FoldedModuleInfo> infos;
  for (const FoldedModule& folded : graph_->folded) {
    infos.push_back({folded.module, folded.kind == FoldedKind::kAddsNothing
                                        ? "adds_nothing"
                                        : "passes_on"});
  }
  return infos;
}

int64_t ConditioningModel::working_bytes_per_row() const {
  int64_t bytes = 0;
  for (const ValueInfo& value : graph_->values) {
    bytes += (value.scalar ? 1 : value.cols) * int64_t{sizeof(float)};
  }
  return bytes;
}

absl::StatusOr<std::vector<ConditioningOutput>> ConditioningModel::Compute(
    const ConditioningInputs& inputs,
    const std::vector<std::string>& names) const {
  const ModelGraph& graph = *graph_;
  RETURN_IF_ERROR(CheckInputNames(*family_, inputs));
  ASSIGN_OR_RETURN(const std::string time, TimeInput(*family_, graph, inputs));
  const int64_t rows = static_cast<int64_t>(inputs.Get(time).size());
  if (rows < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(time, ": at least one timestep is required"));
  }
  if (rows > kMaxConditioningRows) {
    return absl::ResourceExhaustedError(
        absl::StrCat(time, ": ", rows, " timesteps is above the limit of ",
                     kMaxConditioningRows));
  }
  Values values(graph.values.size());
  std::vector<bool> provided(graph.values.size(), false);
  RETURN_IF_ERROR(
      TakeInputs(*family_, graph, inputs, rows, dtype_, values, provided));
  ASSIGN_OR_RETURN(const std::vector<Wanted> wanted,
                   WantedOutputs(*family_, graph, names));
  std::vector<int> wanted_slots;
  for (const Wanted& w : wanted) wanted_slots.push_back(w.slot);
  const std::vector<bool> needed = graph.OpsFor(wanted_slots, provided);
  // A value before the one a given input stands for needs the input it
  // replaces.
  for (const InputSpec& spec : graph.inputs) {
    if (spec.stands_for.empty() || inputs.Get(spec.name).empty()) continue;
    const int replaced = graph.SlotOf(spec.instead_of);
    for (size_t op = 0; op < needed.size(); ++op) {
      const std::vector<int>& in = graph.ops[op]->in;
      if (needed[op] && std::find(in.begin(), in.end(), replaced) != in.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("outputs: ", Quoted(graph.names[graph.ops[op]->out]),
                         " is computed from ", spec.instead_of,
                         ", which a call giving ", spec.name, " has not"));
      }
    }
  }
  const CachePlan plan = PlanCaching(graph, needed, wanted_slots);
  const RunContext context{dtype_, sinusoid_backend_.get(),
                           linear_engine_.get()};
  for (const int op : plan.scalar_ops) {
    RETURN_IF_ERROR(graph.ops[op]->Run(context, rows, values));
  }
  RETURN_IF_ERROR(FillCachedRows(graph, plan, context, cache_key_,
                                 options_.cache.get(), rows, values));
  for (const int op : plan.other_ops) {
    RETURN_IF_ERROR(graph.ops[op]->Run(context, rows, values));
  }
  std::vector<ConditioningOutput> outputs;
  for (const Wanted& w : wanted) {
    outputs.push_back(Encode(w, graph, dtype_, rows, values));
  }
  return outputs;
}

}  // namespace temb::models
