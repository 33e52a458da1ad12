// diffusers' CogView4Transformer2DModel: CogView4, with the size conditions
// SDXL introduced (original size, crop, target size).
#include <string>
#include <vector>

#include "builders.h"
#include "registry.h"

namespace temb::models::families {

FamilyDescription CogView4() {
  FamilyDescription family =
      NewFamily("CogView4Transformer2DModel", "cogview4");
  const char* kSizes[] = {"original_size", "crop_coords", "target_size"};
  family.inputs = {
      {"t", "", "", "the scheduler's timesteps (0..1000)"},
      CapturedAt(
          "time_condition_embed", "original_size",
          InModelDType({"original_size", "2", "",
                        "the pipeline's original_size (height, width)"})),
      CapturedAt(
          "time_condition_embed", "crop_coords",
          InModelDType({"crop_coords", "2", "",
                        "the pipeline's crops_coords_top_left (top, left)"})),
      CapturedAt("time_condition_embed", "target_size",
                 InModelDType({"target_size", "2", "",
                               "the pipeline's target_size (height, width)"})),
      CapturedAt("time_condition_embed", "timestep",
                 ForwardTimestep("t_model")),
  };
  std::vector<Op>& ops = family.ops;
  // Pipeline: t.expand(B), the scheduler's float32 t.
  // CogView3CombinedTimestepSizeEmbeddings: Timesteps(D, flip, shift 0) in
  // float32, cast to hidden_states' dtype, then its MLP.
  ops.push_back(Cast("t_model", "t", ValueDType::kFloat32));
  Op sinus = Sinusoid("t_sinus", "t_model", 1);
  sinus.sinusoid.dim_is_width = true;
  ops.push_back(sinus);
  ops.push_back(Cast("t_proj", "t_sinus", ValueDType::kModel));
  AppendMlpOf(&ops, "t_emb", "t_proj", "time_condition_embed.timestep_embedder",
              "time_embed_dim", 1, 1, "");
  // The sizes, in the prompt embedding's dtype: condition_proj =
  // Timesteps(condition_dim, flip, shift 0) of each value in float32,
  // concatenated original, crop, target, then cast and
  // PixArtAlphaTextProjection (linear_1, SiLU, linear_2).
  std::vector<std::string> sinusoids;
  for (const std::string size : kSizes) {
    ops.push_back(Cast(size + "_model", size, ValueDType::kModel));
    ops.push_back(
        SinusoidOfSize(size + "_sinus", size + "_model", "condition_dim"));
    sinusoids.push_back(size + "_sinus");
  }
  ops.push_back(Concat("sizes_f32", sinusoids, ValueDType::kFloat32));
  ops.push_back(Cast("sizes", "sizes_f32", ValueDType::kModel));
  AppendMlpOf(&ops, "sizes_emb", "sizes",
              "time_condition_embed.condition_embedder", "time_embed_dim", 1, 1,
              "");
  ops.push_back(Add("temb", "t_emb", "sizes_emb"));
  // The forward applies F.silu once; every block's norm1.linear and the
  // output norm's Linear read it, with no SiLU of their own.
  ops.push_back(Silu("temb_silu", "temb"));
  ops.push_back(Linear("block_mod", "temb_silu",
                       "transformer_blocks.{i}.norm1.linear", 12,
                       "num_layers"));
  ops.push_back(Linear("norm_out", "temb_silu", "norm_out.linear", 2));
  family.outputs = {
      {"temb", "temb",
       "[N, time_embed_dim]: timestep_embedder + condition_embedder, before "
       "the forward's SiLU"},
      {"block_mod", "block_mod",
       "[N, L, 12D], image and text interleaved: shift_msa, c_shift_msa, "
       "scale_msa, c_scale_msa, gate_msa, c_gate_msa, shift_mlp, c_shift_mlp, "
       "scale_mlp, c_scale_mlp, gate_mlp, c_gate_mlp"},
      {"norm_out", "norm_out", "[N, 2D]: scale, shift"},
  };
  ReturnedBy(&family, "temb", "time_condition_embed");
  return family;
}

}  // namespace temb::models::families
