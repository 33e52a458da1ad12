#include "builders.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace temb::models::families {

FamilyDescription NewFamily(std::string class_name, std::string name,
                            std::vector<std::string> width_fields) {
  FamilyDescription family;
  family.class_name = std::move(class_name);
  family.name = std::move(name);
  family.width_fields = std::move(width_fields);
  return family;
}

Op NoBias(Op op) {
  op.has_bias = false;
  return op;
}

InputSpec ForwardTimestep(const std::string& value,
                          const std::string& argument) {
  InputSpec input;
  input.name = "timestep";
  input.help = "the transformer forward's " + argument +
               " as the pipeline passes it (instead of t)";
  input.stands_for = value;
  return input;
}

InputSpec CapturedAt(std::string module, std::string argument,
                     InputSpec input) {
  input.module = std::move(module);
  input.argument = std::move(argument);
  return input;
}

InputSpec InModelDType(InputSpec input) {
  input.in_model_dtype = true;
  return input;
}

InputSpec EmbedderTimestep(const std::string& module,
                           const std::string& argument) {
  InputSpec input;
  input.name = "embedder_timestep";
  input.help =
      "the timestep " + module + " receives as " + argument + " (instead of t)";
  input.stands_for = "t_model";
  return CapturedAt(module, argument, std::move(input));
}

InputSpec EmbedderGuidance(const std::string& module,
                           const std::string& argument,
                           const std::string& when) {
  InputSpec input;
  input.name = "embedder_guidance";
  input.when = when;
  input.help = "the guidance " + module + " receives as " + argument +
               " (instead of guidance)";
  input.stands_for = "g_model";
  return CapturedAt(module, argument, std::move(input));
}

Op MakeOp(OpKind kind, std::string out, std::vector<std::string> in) {
  Op op;
  op.kind = kind;
  op.out = std::move(out);
  op.in = std::move(in);
  return op;
}

Op Cast(std::string out, std::string in, ValueDType dtype) {
  Op op = MakeOp(OpKind::kCast, std::move(out), {std::move(in)});
  op.dtype = dtype;
  return op;
}

Op Divide(std::string out, std::string in, double constant) {
  Op op = MakeOp(OpKind::kDivide, std::move(out), {std::move(in)});
  op.constant = constant;
  return op;
}

Op Multiply(std::string out, std::string in, double constant) {
  Op op = MakeOp(OpKind::kMultiply, std::move(out), {std::move(in)});
  op.constant = constant;
  return op;
}

Op SubtractFrom(std::string out, std::string in, double constant) {
  Op op = MakeOp(OpKind::kSubtractFrom, std::move(out), {std::move(in)});
  op.constant = constant;
  return op;
}

Op InFloat32(Op op) {
  op.dtype = ValueDType::kFloat32;
  return op;
}

Op KeptFloat32(Op op) {
  op.weight_dtype = ValueDType::kFloat32;
  op.dtype = ValueDType::kFloat32;
  return op;
}

Op Sinusoid(std::string out, std::string in, double scale) {
  Op op = MakeOp(OpKind::kSinusoid, std::move(out), {std::move(in)});
  op.dtype = ValueDType::kFloat32;
  op.sinusoid.scale = scale;
  return op;
}

Op SinusoidOfSize(std::string out, std::string in, std::string dim) {
  Op op = Sinusoid(std::move(out), std::move(in), 1);
  op.sinusoid.dim_field = std::move(dim);
  return op;
}

Op Linear(std::string out, std::string in, std::string weight, int width_d,
          std::string blocks) {
  Op op = MakeOp(OpKind::kLinear, std::move(out), {std::move(in)});
  op.weight = std::move(weight);
  op.width_d = width_d;
  op.blocks = std::move(blocks);
  return op;
}

Op Silu(std::string out, std::string in) {
  return MakeOp(OpKind::kSilu, std::move(out), {std::move(in)});
}

Op Add(std::string out, std::string a, std::string b) {
  return MakeOp(OpKind::kAdd, std::move(out), {std::move(a), std::move(b)});
}

Op When(std::string flag, Op op) {
  op.when = std::move(flag);
  return op;
}

Op FedBy(std::string input_module, Op op) {
  op.input_module = std::move(input_module);
  return op;
}

Op AdaNormLinear(std::string out, std::string in, const std::string& prefix,
                 int width_d, std::string blocks) {
  return FedBy(prefix + ".silu",
               Linear(std::move(out), std::move(in), prefix + ".linear",
                      width_d, std::move(blocks)));
}

void ReturnedBy(FamilyDescription* family, const std::string& output,
                const std::string& module, const std::string& when) {
  auto& outputs = family->outputs;
  for (auto spec = outputs.begin(); spec != outputs.end(); ++spec) {
    if (spec->name != output) continue;
    if (spec->replaces.empty()) {
      spec->replaces = module;
      spec->when = when;
      return;
    }
    OutputSpec alternative = *spec;
    alternative.replaces = module;
    alternative.when = when;
    outputs.insert(spec + 1, std::move(alternative));
    return;
  }
}

Op TableAdd(std::string out, std::string in, std::string table,
            std::vector<int64_t> lead, ValueDType dtype, std::string blocks) {
  Op op = MakeOp(OpKind::kTableAdd, std::move(out), {std::move(in)});
  op.weight = std::move(table);
  op.table_shape = std::move(lead);
  op.dtype = dtype;
  op.blocks = std::move(blocks);
  return op;
}

Op Concat(std::string out, std::vector<std::string> in, ValueDType dtype) {
  Op op = MakeOp(OpKind::kConcat, std::move(out), std::move(in));
  op.dtype = dtype;
  return op;
}

void AppendSinusoidInModelDType(std::vector<Op>* ops, const std::string& name,
                                const std::string& when) {
  ops->push_back(When(when, Sinusoid(name + "_sinus", name + "_model", 1)));
  ops->push_back(
      When(when, Cast(name + "_proj", name + "_sinus", ValueDType::kModel)));
}

void AppendMlp(std::vector<Op>* ops, const std::string& out,
               const std::string& in, const std::string& prefix,
               const std::string& when) {
  ops->push_back(When(when, Linear(out + "_h", in, prefix + ".linear_1", 1)));
  ops->push_back(When(when, Silu(out + "_a", out + "_h")));
  ops->push_back(When(when, Linear(out, out + "_a", prefix + ".linear_2", 1)));
}

void AppendMlpOf(std::vector<Op>* ops, const std::string& out,
                 const std::string& in, const std::string& prefix,
                 const std::string& field, int div, int groups,
                 const std::string& when) {
  Op first = Linear(out + "_h", in, prefix + ".linear_1", 1);
  Op second = Linear(out, out + "_a", prefix + ".linear_2", 1);
  for (Op* op : {&first, &second}) {
    op->width_field = field;
    op->width_div = div;
    op->groups = groups;
    op->when = when;
  }
  ops->push_back(std::move(first));
  ops->push_back(When(when, Silu(out + "_a", out + "_h")));
  ops->push_back(std::move(second));
}

void AppendFloat32TimePlusPooled(std::vector<Op>* ops, const std::string& t_mlp,
                                 const std::string& pooled_mlp) {
  ops->push_back(Cast("t_model", "t", ValueDType::kFloat32));
  AppendSinusoidInModelDType(ops, "t");
  AppendMlp(ops, "t_emb", "t_proj", t_mlp);
  ops->push_back(Cast("pooled_model", "pooled", ValueDType::kModel));
  AppendMlp(ops, "p_emb", "pooled_model", pooled_mlp);
  ops->push_back(Add("temb", "t_emb", "p_emb"));
  ops->push_back(Silu("temb_silu", "temb"));
}

std::vector<Op> FluxTime() {
  return {Cast("t_pipeline", "t", ValueDType::kModel),
          Divide("t_passed", "t_pipeline", 1000),
          Multiply("t_model", "t_passed", 1000)};
}

void AppendZerosLike(std::vector<Op>* ops, const std::string& out,
                     const std::string& signed_zero, const std::string& in,
                     const std::string& when) {
  ops->push_back(When(when, InFloat32(Multiply(signed_zero, in, 0))));
  ops->push_back(When(when, InFloat32(SubtractFrom(out, signed_zero, 0))));
}

void AppendDualStreamModulation(FamilyDescription* family,
                                const std::string& img_key,
                                const std::string& img_silu,
                                const std::string& txt_key,
                                const std::string& txt_silu,
                                const std::string& chunks) {
  family->ops.push_back(FedBy(
      img_silu, Linear("img_mod", "temb_silu", img_key, 6, "num_layers")));
  family->ops.push_back(FedBy(
      txt_silu, Linear("txt_mod", "temb_silu", txt_key, 6, "num_layers")));
  family->outputs.push_back({"img_mod", "img_mod", "[N, L, 6D]: " + chunks});
  family->outputs.push_back(
      {"txt_mod", "txt_mod", "[N, L, 6D]: same order, text stream"});
}

void AppendAdaLayerNormZeroStreams(FamilyDescription* family) {
  AppendDualStreamModulation(family, "transformer_blocks.{i}.norm1.linear",
                             "transformer_blocks.{i}.norm1.silu",
                             "transformer_blocks.{i}.norm1_context.linear",
                             "transformer_blocks.{i}.norm1_context.silu",
                             kAdaLayerNormZeroChunks);
}

void AppendFluxModulation(FamilyDescription* family) {
  AppendAdaLayerNormZeroStreams(family);
  family->ops.push_back(AdaNormLinear("single_mod", "temb_silu",
                                      "single_transformer_blocks.{i}.norm", 3,
                                      "num_single_layers"));
  family->ops.push_back(AdaNormLinear("norm_out", "temb_silu", "norm_out", 2));
  family->outputs.push_back(
      {"single_mod", "single_mod", "[N, L_single, 3D]: shift, scale, gate"});
  family->outputs.push_back({"norm_out", "norm_out", "[N, 2D]: scale, shift"});
}

void AppendAdaLayerNormSingle(FamilyDescription* family,
                              const std::string& prefix) {
  std::vector<Op>& ops = family->ops;
  ops.push_back(Silu("temb_silu", "temb"));
  ops.push_back(AdaNormLinear("timestep", "temb_silu", prefix, 6));
  ops.push_back(TableAdd("block_mod", "timestep",
                         "transformer_blocks.{i}.scale_shift_table", {6},
                         ValueDType::kModel, "num_layers"));
  ops.push_back(TableAdd("norm_out", "temb", "scale_shift_table", {2},
                         ValueDType::kModel));
  family->outputs = {
      {"embedded_timestep", "temb", "[N, D]", 0},
      {"timestep", "timestep", "[N, 6D]: " + prefix + "'s Linear", 0},
      {"block_mod", "block_mod",
       "[N, L, 6, D]: shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, "
       "gate_mlp",
       6},
      {"norm_out", "norm_out", "[N, 2, D]: shift, scale", 2},
  };
}

}  // namespace temb::models::families
