// Transformers built as FLUX.1-schnell without its pooled text embedding:
// one TimestepEmbedding of a time the family computes (LongCat-Image's and
// Ovis-Image's is FLUX.1's: the pipeline's t / 1000 in the latents' dtype,
// times 1000 in the model's), FLUX.1's blocks.
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
// both as time_proj and timestep_embedder.  `time` gives t_model, the
// sinusoid's input, from the scheduler's t, and `timestep_inputs` are the
// values the forward and the embedder receive instead of t.
FamilyDescription FluxTimeOnly(std::string class_name, std::string name,
                               const std::string& embedder,
                               const std::string& mlp, std::vector<Op> time,
                               std::vector<InputSpec> timestep_inputs) {
  FamilyDescription family = NewFamily(std::move(class_name), std::move(name));
  family.inputs = {{"t", "", "", "the scheduler's timesteps (0..1000)"}};
  for (InputSpec& input : timestep_inputs) {
    family.inputs.push_back(std::move(input));
  }
  std::vector<Op>& ops = family.ops;
  ops = std::move(time);
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

// FLUX.1's time: the forward receives t_passed, the embedder t_model.
FamilyDescription FluxTimeOnly(std::string class_name, std::string name,
                               const std::string& embedder,
                               const std::string& mlp) {
  return FluxTimeOnly(
      std::move(class_name), std::move(name), embedder, mlp, FluxTime(),
      {ForwardTimestep("t_passed"),
       EmbedderTimestep(embedder, mlp.empty() ? "timestep" : "timesteps")});
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

// Motif-Video (MotifVideoConditionEmbedding time_text_embed): its
// pipelines pass the scheduler's float32 t.expand(B), embedded as it is
// (no x 1000 anywhere); the float32 sinusoid is cast to the MLP's dtype
// where that is fp16 or bf16, which is the model's dtype (a float32 model
// keeps it float32).  The decoder blocks are the last single-stream
// blocks, with the same temb.
FamilyDescription MotifVideo() {
  return FluxTimeOnly(
      "MotifVideoTransformer3DModel", "motif-video", "time_text_embed", "",
      {Cast("t_model", "t", ValueDType::kFloat32)},
      {CapturedAt("time_text_embed", "timestep", ForwardTimestep("t_model"))});
}

}  // namespace temb::models::families
