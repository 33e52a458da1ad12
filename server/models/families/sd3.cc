// diffusers' SD3Transformer2DModel: SD3 and SD3.5.
#include <string>
#include <utility>
#include <vector>

#include "builders.h"
#include "registry.h"

namespace temb::models::families {
namespace {

Op Select(BlockSelect select, Op op, std::string block_list = "") {
  op.select = select;
  op.block_list = std::move(block_list);
  return op;
}

}  // namespace

FamilyDescription Sd3() {
  FamilyDescription family = NewFamily("SD3Transformer2DModel", "sd3");
  family.inputs = {
      {"t", "", "", "the scheduler's timesteps (0..1000)"},
      CapturedAt("time_text_embed", "pooled_projection",
                 {"pooled", "pooled_projection_dim", "",
                  "the pooled CLIP-L and CLIP-G text embedding"}),
      CapturedAt("time_text_embed", "timestep", ForwardTimestep("t_model")),
  };
  std::vector<Op>& ops = family.ops;
  // Pipeline: timestep = t.expand(B), the scheduler's float32 t with no
  // cast; CombinedTimestepTextProjEmbeddings: Timesteps(256, flip, shift 0)
  // of that float32 t, cast to the pooled projection's dtype.
  // PixArtAlphaTextProjection(act_fn="silu") is the same MLP as
  // TimestepEmbedding.
  AppendFloat32TimePlusPooled(&ops, "time_text_embed.timestep_embedder",
                              "time_text_embed.text_embedder");
  // JointTransformerBlock i: norm1 is SD35AdaLayerNormZeroX (9D) when i is
  // in dual_attention_layers, else AdaLayerNormZero (6D); norm1_context is
  // AdaLayerNormZero except in the last block (context_pre_only), where it
  // is AdaLayerNormContinuous (2D).  Each width is its own output.
  ops.push_back(
      Select(BlockSelect::kUnlisted,
             AdaNormLinear("img_mod", "temb_silu",
                           "transformer_blocks.{i}.norm1", 6, "num_layers"),
             "dual_attention_layers"));
  ops.push_back(
      Select(BlockSelect::kListed,
             AdaNormLinear("img_mod_dual", "temb_silu",
                           "transformer_blocks.{i}.norm1", 9, "num_layers"),
             "dual_attention_layers"));
  ops.push_back(Select(
      BlockSelect::kAllButLast,
      AdaNormLinear("txt_mod", "temb_silu",
                    "transformer_blocks.{i}.norm1_context", 6, "num_layers")));
  // AdaLayerNormContinuous: linear(SiLU(temb).to(x.dtype)), a no-op cast.
  ops.push_back(Select(
      BlockSelect::kLast,
      AdaNormLinear("txt_mod_last", "temb_silu",
                    "transformer_blocks.{i}.norm1_context", 2, "num_layers")));
  ops.push_back(AdaNormLinear("norm_out", "temb_silu", "norm_out", 2));
  family.outputs = {
      {"temb", "temb", "[N, D]"},
      {"img_mod", "img_mod",
       "[N, L - L_dual, 6D], the blocks not in dual_attention_layers: "
       "shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp"},
      {"img_mod_dual", "img_mod_dual",
       "[N, L_dual, 9D], the blocks in dual_attention_layers: the same six, "
       "then shift_msa2, scale_msa2, gate_msa2"},
      {"txt_mod", "txt_mod",
       "[N, L - 1, 6D], blocks 0 .. L-2: same order as img_mod, text stream"},
      {"txt_mod_last", "txt_mod_last",
       "[N, 2D], block L-1 (context_pre_only): scale, shift"},
      {"norm_out", "norm_out", "[N, 2D]: scale, shift"},
  };
  ReturnedBy(&family, "temb", "time_text_embed");
  return family;
}

}  // namespace temb::models::families
