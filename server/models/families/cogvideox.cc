// diffusers' CogVideoXTransformer3DModel: CogVideoX and CogVideoX 1.5.
#include <string>
#include <vector>

#include "builders.h"
#include "registry.h"

namespace temb::models::families {

FamilyDescription CogVideoX() {
  FamilyDescription family =
      NewFamily("CogVideoXTransformer3DModel", "cogvideox");
  family.inputs = {
      {"t", "", "", "the scheduler's timesteps (0..1000)"},
      // Embedded after the timestep: the forward's argument.
      CapturedAt(
          "", "ofs",
          InModelDType({"ofs", "", "ofs_embed_dim",
                        "the ofs value (CogVideoX 1.5 I2V; its pipeline passes "
                        "2.0)"})),
      CapturedAt("time_proj", "timesteps", ForwardTimestep("t_model")),
  };
  std::vector<Op>& ops = family.ops;
  // Pipeline: t.expand(B), the scheduler's t; time_proj = Timesteps(D,
  // flip_sin_to_cos, freq_shift) from config.json, in float32, cast to
  // hidden_states' dtype.
  ops.push_back(Cast("t_model", "t", ValueDType::kFloat32));
  Op sinus = Sinusoid("t_sinus", "t_model", 1);
  sinus.sinusoid.dim_is_width = true;
  sinus.sinusoid.flip_field = "flip_sin_to_cos";
  sinus.sinusoid.shift_field = "freq_shift";
  ops.push_back(sinus);
  ops.push_back(Cast("t_proj", "t_sinus", ValueDType::kModel));
  // time_embedding: TimestepEmbedding(D, time_embed_dim).
  AppendMlpOf(&ops, "t_emb", "t_proj", "time_embedding", "time_embed_dim", 1, 1,
              "");
  // CogVideoX 1.5 I2V: the pipeline's ofs is latents.new_full((1,), 2.0),
  // in the latents' dtype; ofs_proj = Timesteps(ofs_embed_dim, ...), its
  // MLP ofs_embed_dim wide, added to the time embedding.
  const std::string ofs = "ofs_embed_dim";
  ops.push_back(When(ofs, Cast("ofs_model", "ofs", ValueDType::kModel)));
  Op ofs_sinus = When(ofs, Sinusoid("ofs_sinus", "ofs_model", 1));
  ofs_sinus.sinusoid.dim_field = ofs;
  ofs_sinus.sinusoid.flip_field = "flip_sin_to_cos";
  ofs_sinus.sinusoid.shift_field = "freq_shift";
  ops.push_back(ofs_sinus);
  ops.push_back(When(ofs, Cast("ofs_proj", "ofs_sinus", ValueDType::kModel)));
  AppendMlpOf(&ops, "ofs_emb", "ofs_proj", "ofs_embedding", ofs, 1, 1, ofs);
  ops.push_back(When(ofs, Add("temb", "t_emb", "ofs_emb")));
  ops.push_back(When("!" + ofs, Cast("temb", "t_emb", ValueDType::kModel)));
  ops.push_back(Silu("temb_silu", "temb"));
  // CogVideoXLayerNormZero: linear(silu(temb)), time_embed_dim -> 6D.
  ops.push_back(AdaNormLinear("norm1", "temb_silu",
                              "transformer_blocks.{i}.norm1", 6, "num_layers"));
  ops.push_back(AdaNormLinear("norm2", "temb_silu",
                              "transformer_blocks.{i}.norm2", 6, "num_layers"));
  // AdaLayerNorm(chunk_dim=1): linear(silu(temb)) -> 2D.
  ops.push_back(AdaNormLinear("norm_out", "temb_silu", "norm_out", 2));
  family.outputs = {
      {"temb", "temb", "[N, time_embed_dim]", 0},
      {"norm1", "norm1",
       "[N, L, 6D]: shift, scale, gate, enc_shift, enc_scale, enc_gate", 0},
      {"norm2", "norm2", "[N, L, 6D]: the same six, after attention", 0},
      {"norm_out", "norm_out", "[N, 2D]: shift, scale", 0},
  };
  // The parameterless time_proj is handed t; time_embedding then passes
  // the served temb on, and the ofs embedding the forward adds to it is
  // already in it.
  ReturnedBy(&family, "temb", "time_proj");
  family.folded = {{"time_embedding", FoldedKind::kPassesOn},
                   {"ofs_embedding", FoldedKind::kAddsNothing, ofs}};
  return family;
}

}  // namespace temb::models::families
