// diffusers' HiDreamImageTransformer2DModel: HiDream-I1.
#include <string>
#include <tuple>
#include <vector>

#include "builders.h"
#include "registry.h"

namespace temb::models::families {

FamilyDescription HiDream() {
  FamilyDescription family =
      NewFamily("HiDreamImageTransformer2DModel", "hidream-i1");
  family.inputs = {
      {"t", "", "", "the scheduler's timesteps (0..1000)"},
      // p_embedder runs after t_embedder: the forward's argument.
      CapturedAt("", "pooled_embeds",
                 {"pooled", "text_emb_dim", "",
                  "the pooled CLIP-L + CLIP-G text embedding"}),
      CapturedAt("t_embedder", "timesteps",
                 ForwardTimestep("t_model", "timesteps")),
  };
  std::vector<Op>& ops = family.ops;
  // Pipeline: t.expand(B), the scheduler's float32 t; HiDreamImage-
  // TimestepEmbed: Timesteps(256, flip, shift 0) in float32, cast to
  // hidden_states' dtype, then its MLP.
  // HiDreamImagePooledEmbed: an MLP of the pipeline's pooled embedding.
  AppendFloat32TimePlusPooled(&ops, "t_embedder.timestep_embedder",
                              "p_embedder.pooled_embedder");
  // adaLN_modulation = Sequential(SiLU, Linear): 12D in the double-stream
  // blocks (image then text), 6D in the single-stream ones, 2D at the end.
  for (const auto& [out, prefix, width_d, blocks] :
       {std::tuple("double_mod", "double_stream_blocks.{i}.block", 12,
                   "num_layers"),
        std::tuple("single_mod", "single_stream_blocks.{i}.block", 6,
                   "num_single_layers"),
        std::tuple("final_mod", "final_layer", 2, "")}) {
    const std::string module = std::string(prefix) + ".adaLN_modulation";
    ops.push_back(FedBy(module + ".0", Linear(out, "temb_silu", module + ".1",
                                              width_d, blocks)));
  }
  family.outputs = {
      {"temb", "temb", "[N, D]"},
      {"double_mod", "double_mod",
       "[N, L, 12D]: shift_msa_i, scale_msa_i, gate_msa_i, shift_mlp_i, "
       "scale_mlp_i, gate_mlp_i, then the same six for the text stream (_t)"},
      {"single_mod", "single_mod",
       "[N, L_single, 6D]: shift_msa, scale_msa, gate_msa, shift_mlp, "
       "scale_mlp, gate_mlp"},
      {"final_mod", "final_mod", "[N, 2D]: shift, scale"},
  };
  ReturnedBy(&family, "temb", "t_embedder");
  // p_embedder's MLP is added to t_embedder's in the forward: temb holds
  // both.
  family.folded = {{"p_embedder", FoldedKind::kAddsNothing}};
  return family;
}

}  // namespace temb::models::families
