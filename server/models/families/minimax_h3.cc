// diffusers' MiniMaxH3Transformer3DModel: MiniMax-H3, whose packed sequence
// holds video, text and audio tokens, each at its own noise level.
#include <string>
#include <vector>

#include "builders.h"
#include "registry.h"

namespace temb::models::families {

FamilyDescription MiniMaxH3() {
  FamilyDescription family =
      NewFamily("MiniMaxH3Transformer3DModel", "minimax-h3", {"hidden_size"});
  // diffusers 0.42.1 has no MiniMax-H3 pipeline: t is what the forward
  // takes, the distinct noise levels of the packed sequence in [0, 1],
  // unscaled (nothing multiplies by 1000).
  family.inputs = {
      {"t", "", "",
       "the forward's timestep: the distinct noise levels of the packed "
       "sequence, in [0, 1]"},
      CapturedAt("time_proj", "timesteps", ForwardTimestep("t_model")),
  };
  std::vector<Op>& ops = family.ops;
  // time_proj = Timesteps(freq_dim, flip, shift 0) in float32, cast to
  // time_embedder's dtype: float32, a module the checkpoint and
  // from_pretrained keep in float32 (_keep_in_fp32_modules).
  ops.push_back(Cast("t_model", "t", ValueDType::kFloat32));
  ops.push_back(SinusoidOfSize("t_sinus", "t_model", "freq_dim"));
  Op hidden =
      KeptFloat32(Linear("temb_h", "t_sinus", "time_embedder.linear_1", 1));
  hidden.width_field = "time_embed_hidden_dim";
  ops.push_back(hidden);
  ops.push_back(KeptFloat32(Silu("temb_a", "temb_h")));
  Op out = KeptFloat32(Linear("temb", "temb_a", "time_embedder.linear_2", 1));
  out.width_field = "time_embed_dim";
  ops.push_back(out);
  // Every AdaLN projection: linear(silu(temb).to(its dtype)), the SiLU of
  // the float32 temb in float32 and only then the cast (the reverse of
  // FLUX.1's order, where temb is rounded before its SiLU).
  ops.push_back(InFloat32(Silu("temb_silu_f32", "temb")));
  ops.push_back(Cast("temb_silu", "temb_silu_f32", ValueDType::kModel));
  // MiniMaxH3AdaLayerNormModulation: one Linear time_embed_dim -> 3 x 6D
  // per block, viewed as a row of 6D per (t, modality).
  ops.push_back(Linear("block_mod", "temb_silu",
                       "transformer_blocks.{i}.adaln_proj.linear", 18,
                       "num_layers"));
  // MiniMaxH3AdaLayerNormOut: shift first.
  ops.push_back(Linear("norm_out", "temb_silu", "norm_out.linear", 2));
  family.outputs = {
      {"temb", "temb", "[N, time_embed_dim] float32"},
      {"block_mod", "block_mod",
       "[N, L, 18D]: for video, text and audio in turn (token_tags 0, 1, 2): "
       "shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp; a "
       "token reads modality token_tags[j] of its t's row, the model's row "
       "timestep_indices[j] * 3 + token_tags[j]"},
      {"norm_out", "norm_out",
       "[N, 2D]: shift, scale; a token reads its t's row"},
  };
  // The parameterless Timesteps module is handed t; the float32 time MLP
  // after it passes the served temb on.  The AdaLN SiLUs are functional,
  // not modules: no Linear names an input module.
  ReturnedBy(&family, "temb", "time_proj");
  family.folded = {{"time_embedder"}};
  return family;
}

}  // namespace temb::models::families
