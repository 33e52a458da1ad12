// diffusers' Lumina2Transformer2DModel: Lumina-Image-2.0.
#include <string>
#include <vector>

#include "builders.h"
#include "registry.h"

namespace temb::models::families {

FamilyDescription Lumina2() {
  FamilyDescription family =
      NewFamily("Lumina2Transformer2DModel", "lumina2", {"hidden_size"});
  family.inputs = {{"t", "", "", "the scheduler's timesteps (0..1000)"},
                   CapturedAt("time_caption_embed.time_proj", "timesteps",
                              ForwardTimestep("t_model"))};
  std::vector<Op>& ops = family.ops;
  // Pipeline: 1 - t / num_train_timesteps (1000), in float32: t = 0 is the
  // noise; Timesteps(256, flip, shift 0) of it, with no factor 1000, cast
  // to hidden_states' dtype.
  ops.push_back(Cast("t_given", "t", ValueDType::kFloat32));
  ops.push_back(InFloat32(Divide("t_fraction", "t_given", 1000)));
  ops.push_back(InFloat32(SubtractFrom("t_model", "t_fraction", 1)));
  AppendSinusoidInModelDType(&ops, "t");
  // The time embedding is min(D, 1024) wide.
  AppendMlpOf(&ops, "temb", "t_proj", "time_caption_embed.timestep_embedder",
              "min(hidden_size, 1024)", 1, 1, "");
  ops.push_back(Silu("temb_silu", "temb"));
  // LuminaRMSNormZero of every modulated block: linear(silu(temb)), 4D
  // (scale_msa, gate_msa, scale_mlp, gate_mlp); LuminaLayerNormContinuous:
  // linear_1(silu(temb).to(x.dtype)), D (scale).
  ops.push_back(AdaNormLinear("refiner_mod", "temb_silu",
                              "noise_refiner.{i}.norm1", 4,
                              "num_refiner_layers"));
  ops.push_back(AdaNormLinear("layer_mod", "temb_silu", "layers.{i}.norm1", 4,
                              "num_layers"));
  ops.push_back(FedBy("norm_out.silu",
                      Linear("norm_out", "temb_silu", "norm_out.linear_1", 1)));
  family.outputs = {
      {"temb", "temb", "[N, min(D, 1024)]"},
      {"refiner_mod", "refiner_mod",
       "[N, L_refiner, 4D]: scale_msa, gate_msa, scale_mlp, gate_mlp "
       "(noise_refiner)"},
      {"layer_mod", "layer_mod", "[N, L, 4D]: the same, layers"},
      {"norm_out", "norm_out", "[N, D]: scale"},
  };
  // Its parameterless Timesteps module is handed t; the MLP after it then
  // passes the served temb on.
  ReturnedBy(&family, "temb", "time_caption_embed.time_proj");
  family.folded = {{"time_caption_embed.timestep_embedder"}};
  return family;
}

}  // namespace temb::models::families
