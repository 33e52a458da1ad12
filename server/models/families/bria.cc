// diffusers' BriaTransformer2DModel: Bria 3.2, FLUX.1's blocks over a time
// embedding whose sinusoid has the config's max_period (time_theta).
#include <vector>

#include "builders.h"
#include "registry.h"

namespace temb::models::families {

FamilyDescription Bria() {
  FamilyDescription family = NewFamily("BriaTransformer2DModel", "bria");
  // With guidance_embeds the forward adds the guidance embedding only
  // under `if guidance:`, a tensor's truth value (one element): not served.
  family.unsupported_flags = {"guidance_embeds"};
  family.inputs = {{"t", "", "", "the scheduler's timesteps (0..1000)"},
                   ForwardTimestep("t_given"),
                   EmbedderTimestep("time_embed", "timestep")};
  std::vector<Op>& ops = family.ops;
  // BriaPipeline: t.expand(B), the scheduler's float32 t; the model casts
  // it to hidden_states' dtype, then BriaTimesteps(256, flip, shift 0,
  // max_period = time_theta) in float32, cast back, and the MLP.
  ops.push_back(Cast("t_given", "t", ValueDType::kFloat32));
  ops.push_back(Cast("t_model", "t_given", ValueDType::kModel));
  Op sinus = Sinusoid("t_sinus", "t_model", 1);
  sinus.sinusoid.max_period_field = "time_theta";
  ops.push_back(sinus);
  ops.push_back(Cast("t_proj", "t_sinus", ValueDType::kModel));
  AppendMlp(&ops, "temb", "t_proj", "time_embed.timestep_embedder");
  ops.push_back(Silu("temb_silu", "temb"));
  family.outputs = {{"temb", "temb", "[N, D]"}};
  AppendFluxModulation(&family);
  ReturnedBy(&family, "temb", "time_embed");
  return family;
}

}  // namespace temb::models::families
