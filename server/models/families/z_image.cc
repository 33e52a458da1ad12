// diffusers' ZImageTransformer2DModel: Z-Image.
#include <string>
#include <vector>

#include "builders.h"
#include "registry.h"

namespace temb::models::families {

FamilyDescription ZImage() {
  FamilyDescription family =
      NewFamily("ZImageTransformer2DModel", "z-image", {"dim"});
  // One final layer, keyed "2-1": the released configs' only patch sizes.
  family.requirements = {{"all_patch_size", "[2]"},
                         {"all_f_patch_size", "[1]"}};
  family.inputs = {{"t", "", "", "the scheduler's timesteps (0..1000)"},
                   ForwardTimestep("t_pipeline", "t"),
                   // Omni mode embeds the clean images' t as well.
                   EmbedderTimestep("t_embedder", "t")};
  std::vector<Op>& ops = family.ops;
  // Pipeline: (1000 - t.expand(B)) / 1000 in float32; the model embeds
  // t * config.t_scale.
  ops.push_back(Cast("t_given", "t", ValueDType::kFloat32));
  ops.push_back(InFloat32(SubtractFrom("t_reversed", "t_given", 1000)));
  ops.push_back(InFloat32(Divide("t_pipeline", "t_reversed", 1000)));
  Op scaled = Multiply("t_model", "t_pipeline", 1000);
  scaled.constant_field = "t_scale";
  ops.push_back(InFloat32(scaled));
  // TimestepEmbedder: its own float32 sinusoid (the same formula as
  // Timesteps(256, flip, shift 0)), cast to its weights' dtype, then
  // mlp = Sequential(Linear(256, 1024), SiLU, Linear(1024, 256)): the time
  // embedding is min(D, 256) wide.
  AppendSinusoidInModelDType(&ops, "t");
  Op first = Linear("temb_h", "t_proj", "t_embedder.mlp.0", 1);
  first.width_field = "1024";
  ops.push_back(first);
  ops.push_back(Silu("temb_a", "temb_h"));
  Op second = Linear("temb", "temb_a", "t_embedder.mlp.2", 1);
  second.width_field = "256";
  ops.push_back(second);
  // Every modulated block's adaLN_modulation is one Linear of temb, no
  // SiLU (scale_msa, gate_msa, scale_mlp, gate_mlp; the block applies
  // 1 + scale and tanh); the final layer's is SiLU then Linear (scale).
  ops.push_back(Linear("refiner_mod", "temb",
                       "noise_refiner.{i}.adaLN_modulation.0", 4,
                       "n_refiner_layers"));
  ops.push_back(Linear("layer_mod", "temb", "layers.{i}.adaLN_modulation.0", 4,
                       "n_layers"));
  ops.push_back(Silu("temb_silu", "temb"));
  ops.push_back(FedBy("all_final_layer.2-1.adaLN_modulation.0",
                      Linear("final_mod", "temb_silu",
                             "all_final_layer.2-1.adaLN_modulation.1", 1)));
  family.outputs = {
      {"temb", "temb", "[N, 256]"},
      {"refiner_mod", "refiner_mod",
       "[N, L_refiner, 4D]: scale_msa, gate_msa, scale_mlp, gate_mlp "
       "(noise_refiner)"},
      {"layer_mod", "layer_mod", "[N, L, 4D]: the same, layers"},
      {"final_mod", "final_mod", "[N, D]: scale"},
  };
  ReturnedBy(&family, "temb", "t_embedder");
  return family;
}

}  // namespace temb::models::families
