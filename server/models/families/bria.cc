// diffusers' BriaTransformer2DModel (Bria 3.2) and BriaFiboTransformer2DModel
// (Bria FIBO): FLUX.1's blocks over a time embedding whose sinusoid has the
// config's max_period (time_theta).
#include <string>
#include <utility>
#include <vector>

#include "builders.h"
#include "registry.h"

namespace temb::models::families {

namespace {

// Both classes embed time alike, in modules of the same names.
FamilyDescription BriaTime(std::string class_name, std::string name) {
  FamilyDescription family = NewFamily(std::move(class_name), std::move(name));
  // Bria 3.2's guidance embedder cannot be built (its constructor lacks
  // time_theta in diffusers 0.42.1) and is read under `if guidance:`;
  // FIBO's pipelines pass no guidance: not served.
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

}  // namespace

FamilyDescription Bria() { return BriaTime("BriaTransformer2DModel", "bria"); }

// FIBO's pipelines pass t.expand(B) already in the latents' dtype, which is
// the model's: the model's own cast of it changes nothing.  Its per-block
// text_encoder_layers reach the text tokens only.
FamilyDescription BriaFibo() {
  return BriaTime("BriaFiboTransformer2DModel", "bria-fibo");
}

}  // namespace temb::models::families
