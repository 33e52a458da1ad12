// Transformers built as FLUX.1-schnell without its pooled text embedding:
// FLUX.1's time arithmetic (the pipeline's t / 1000 in the latents' dtype,
// times 1000 in the model's), one TimestepEmbedding, FLUX.1's blocks.
#include <string>
#include <utility>
#include <vector>

#include "builders.h"
#include "registry.h"

namespace temb::models::families {
namespace {

// `class_name` whose embedder is the module `embedder`: the parameterless
// Timesteps module handed t (with `mlp`, the TimestepEmbedding after it,
// passing the served temb on), or, with `mlp` empty, a module holding
// both as time_proj and timestep_embedder.
FamilyDescription FluxTimeOnly(std::string class_name, std::string name,
                               const std::string& embedder,
                               const std::string& mlp) {
  FamilyDescription family = NewFamily(std::move(class_name), std::move(name));
  family.inputs = {
      {"t", "", "", "the scheduler's timesteps (0..1000)"},
      ForwardTimestep("t_passed"),
      EmbedderTimestep(embedder, mlp.empty() ? "timestep" : "timesteps")};
  std::vector<Op>& ops = family.ops;
  ops = FluxTime();
  // Timesteps(256, flip, shift 0) in float32, cast to hidden_states' dtype.
  AppendSinusoidInModelDType(&ops, "t");
  AppendMlp(&ops, "temb", "t_proj",
            mlp.empty() ? embedder + ".timestep_embedder" : mlp);
  ops.push_back(Silu("temb_silu", "temb"));
  family.outputs = {{"temb", "temb", "[N, D]"}};
  AppendFluxModulation(&family);
  ReturnedBy(&family, "temb", embedder);
  if (!mlp.empty()) family.folded = {{mlp}};
  return family;
}

}  // namespace

// LongCatImageTimestepEmbeddings time_embed: time_proj, timestep_embedder.
FamilyDescription LongCatImage() {
  return FluxTimeOnly("LongCatImageTransformer2DModel", "longcat-image",
                      "time_embed", "");
}

// Ovis-Image: time_proj and timestep_embedder on the model itself.
FamilyDescription OvisImage() {
  return FluxTimeOnly("OvisImageTransformer2DModel", "ovis-image", "time_proj",
                      "timestep_embedder");
}

}  // namespace temb::models::families
