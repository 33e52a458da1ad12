// diffusers' WanTransformer3DModel: Wan.
#include <string>
#include <vector>

#include "builders.h"
#include "registry.h"

namespace temb::models::families {

FamilyDescription Wan() {
  FamilyDescription family = NewFamily("WanTransformer3DModel", "wan");
  family.inputs = {{"t", "", "", "the scheduler's timesteps (0..1000)"},
                   CapturedAt("condition_embedder.timesteps_proj", "timesteps",
                              ForwardTimestep("t_model"))};
  std::vector<Op>& ops = family.ops;
  // Pipeline: timestep = t.expand(B), the scheduler's t with no cast;
  // WanTimeTextImageEmbedding: Timesteps(freq_dim, flip, shift 0) in
  // float32.
  ops.push_back(Cast("t_model", "t", ValueDType::kFloat32));
  Op sinus = Sinusoid("t_sinus", "t_model", 1);
  sinus.sinusoid.dim_field = "freq_dim";
  ops.push_back(sinus);
  // time_embedder is in _keep_in_fp32_modules: from_pretrained(torch_dtype)
  // leaves it float32, and the sinusoid is cast to its weights' dtype, so
  // the MLP runs in float32 in a bf16 model; then .type_as(the text
  // embedding), the model's dtype.
  ops.push_back(KeptFloat32(Linear(
      "temb_h", "t_sinus", "condition_embedder.time_embedder.linear_1", 1)));
  ops.push_back(KeptFloat32(Silu("temb_a", "temb_h")));
  ops.push_back(KeptFloat32(Linear(
      "temb_f32", "temb_a", "condition_embedder.time_embedder.linear_2", 1)));
  ops.push_back(Cast("temb", "temb_f32", ValueDType::kModel));
  // time_proj(act_fn(temb)): one Linear D -> 6D shared by every block, in
  // the model's dtype (time_proj is not a kept module).
  ops.push_back(Silu("temb_silu", "temb"));
  ops.push_back(FedBy(
      "condition_embedder.act_fn",
      Linear("timestep_proj", "temb_silu", "condition_embedder.time_proj", 6)));
  // WanTransformerBlock: scale_shift_table (1, 6, D), kept float32, +
  // temb.float(): a float32 sum.
  ops.push_back(KeptFloat32(TableAdd("block_mod", "timestep_proj",
                                     "blocks.{i}.scale_shift_table", {1, 6},
                                     ValueDType::kFloat32, "num_layers")));
  // Output norm: scale_shift_table (1, 2, D) + temb.unsqueeze(1), the raw
  // bf16 temb promoted to float32 by the float32 table.
  ops.push_back(KeptFloat32(TableAdd("norm_out", "temb", "scale_shift_table",
                                     {1, 2}, ValueDType::kFloat32)));
  family.outputs = {
      {"temb", "temb", "[N, D]", 0},
      {"timestep_proj", "timestep_proj", "[N, 6, D]: time_proj's output", 6},
      {"block_mod", "block_mod",
       "[N, L, 6, D] float32: shift_msa, scale_msa, gate_msa, c_shift_msa, "
       "c_scale_msa, c_gate_msa",
       6},
      {"norm_out", "norm_out", "[N, 2, D] float32: shift, scale", 2},
  };
  // The parameterless sinusoid module is handed t; the time MLP after it
  // then passes the served temb on.  text_embedder and image_embedder do
  // not depend on t.
  ReturnedBy(&family, "temb", "condition_embedder.timesteps_proj");
  family.folded = {{"condition_embedder.time_embedder"}};
  return family;
}

}  // namespace temb::models::families
