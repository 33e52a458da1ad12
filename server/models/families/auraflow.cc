// diffusers' AuraFlowTransformer2DModel: AuraFlow.
#include <string>
#include <vector>

#include "builders.h"
#include "registry.h"

namespace temb::models::families {

FamilyDescription AuraFlow() {
  FamilyDescription family =
      NewFamily("AuraFlowTransformer2DModel", "auraflow");
  family.inputs = {
      {"t", "", "", "the scheduler's timesteps (0..1000)"},
      CapturedAt("time_step_embed", "timesteps", ForwardTimestep("t_model"))};
  std::vector<Op>& ops = family.ops;
  // AuraFlowPipeline: torch.tensor([t / 1000]) in float32, then
  // .to(latents.dtype); the model embeds it with Timesteps(256, flip,
  // shift 0, scale=1000), the 1000 multiplying the float32 angle, and casts
  // the sinusoid to its parameters' dtype.
  ops.push_back(Cast("t_given", "t", ValueDType::kFloat32));
  ops.push_back(InFloat32(Divide("t_fraction", "t_given", 1000)));
  ops.push_back(Cast("t_model", "t_fraction", ValueDType::kModel));
  ops.push_back(Sinusoid("t_sinus", "t_model", 1000));
  ops.push_back(Cast("t_proj", "t_sinus", ValueDType::kModel));
  AppendMlp(&ops, "temb", "t_proj", "time_step_proj");
  ops.push_back(Silu("temb_silu", "temb"));
  family.outputs = {{"temb", "temb", "[N, D]"}};
  // AdaLayerNormZero(bias=False) of every joint block (norm1, image;
  // norm1_context, text) and single block (norm1); AuraFlowPreFinalBlock's
  // linear(SiLU(temb).to(x.dtype)), temb being in the model's dtype.  No
  // Linear here has a bias.
  constexpr char kChunks[] =
      "shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp";
  ops.push_back(NoBias(AdaNormLinear("joint_img_mod", "temb_silu",
                                     "joint_transformer_blocks.{i}.norm1", 6,
                                     "num_mmdit_layers")));
  ops.push_back(NoBias(AdaNormLinear(
      "joint_txt_mod", "temb_silu",
      "joint_transformer_blocks.{i}.norm1_context", 6, "num_mmdit_layers")));
  ops.push_back(NoBias(AdaNormLinear("single_mod", "temb_silu",
                                     "single_transformer_blocks.{i}.norm1", 6,
                                     "num_single_dit_layers")));
  ops.push_back(NoBias(AdaNormLinear("norm_out", "temb_silu", "norm_out", 2)));
  family.outputs.push_back({"joint_img_mod", "joint_img_mod",
                            std::string("[N, L_joint, 6D]: ") + kChunks});
  family.outputs.push_back({"joint_txt_mod", "joint_txt_mod",
                            "[N, L_joint, 6D]: same order, text stream"});
  family.outputs.push_back(
      {"single_mod", "single_mod", "[N, L_single, 6D]: same order"});
  family.outputs.push_back({"norm_out", "norm_out", "[N, 2D]: scale, shift"});
  // The parameterless Timesteps module is handed t; time_step_proj then
  // passes the served temb on.
  ReturnedBy(&family, "temb", "time_step_embed");
  family.folded = {{"time_step_proj"}};
  return family;
}

}  // namespace temb::models::families
