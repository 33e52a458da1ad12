// diffusers' FluxTransformer2DModel: FLUX.1.
#include "flux1.h"

#include <string>
#include <utility>
#include <vector>

#include "builders.h"
#include "registry.h"

namespace temb::models::families {

FamilyDescription Flux1Like(std::string class_name, std::string name,
                            std::vector<Op> time_ops,
                            const std::string& forward_value) {
  FamilyDescription family = NewFamily(std::move(class_name), std::move(name));
  family.inputs = {
      {"t", "", "", "the scheduler's timesteps (0..1000)"},
      {"guidance", "", "guidance_embeds", "the guidance scale (dev)"},
      CapturedAt("time_text_embed", "pooled_projection",
                 {"pooled", "pooled_projection_dim", "",
                  "the pooled CLIP text embedding"}),
      EmbedderGuidance("time_text_embed", "guidance"),
  };
  // The embedder's timestep: the forward's (HunyuanVideo), or FLUX.1's
  // forward value times 1000 in the model's dtype.
  if (forward_value == "t_model") {
    family.inputs.push_back(CapturedAt("time_text_embed", "timestep",
                                       ForwardTimestep(forward_value)));
  } else {
    family.inputs.push_back(ForwardTimestep(forward_value));
    family.inputs.push_back(EmbedderTimestep("time_text_embed", "timestep"));
  }
  std::vector<Op>& ops = family.ops;
  ops = std::move(time_ops);
  // CombinedTimestep(Guidance)TextProjEmbeddings: Timesteps(256, flip,
  // shift 0), the float32 sinusoid cast to the pooled projection's dtype.
  AppendSinusoidInModelDType(&ops, "t");
  AppendMlp(&ops, "t_emb", "t_proj", "time_text_embed.timestep_embedder");
  // Guidance: a float32 tensor from the pipeline, then
  // guidance.to(hidden_states.dtype) * 1000 in the model.
  ops.push_back(When("guidance_embeds",
                     Cast("g_model_dtype", "guidance", ValueDType::kModel)));
  ops.push_back(
      When("guidance_embeds", Multiply("g_model", "g_model_dtype", 1000)));
  AppendSinusoidInModelDType(&ops, "g", "guidance_embeds");
  AppendMlp(&ops, "g_emb", "g_proj", "time_text_embed.guidance_embedder",
            "guidance_embeds");
  // (t + g) first, then + pooled: each sum rounded to the model's dtype.
  ops.push_back(When("guidance_embeds", Add("tg_emb", "t_emb", "g_emb")));
  ops.push_back(
      When("!guidance_embeds", Cast("tg_emb", "t_emb", ValueDType::kModel)));
  // The pipeline's pooled embedding is in the model's dtype.
  ops.push_back(Cast("pooled_model", "pooled", ValueDType::kModel));
  AppendMlp(&ops, "p_emb", "pooled_model", "time_text_embed.text_embedder");
  ops.push_back(Add("temb", "tg_emb", "p_emb"));
  ops.push_back(Silu("temb_silu", "temb"));
  family.outputs = {{"temb", "temb", "[N, D]"}};
  AppendFluxModulation(&family);
  ReturnedBy(&family, "temb", "time_text_embed");
  return family;
}

FamilyDescription Flux1() {
  // The pipeline hands the transformer t / 1000 in the latents' dtype.
  return Flux1Like("FluxTransformer2DModel", "flux.1", FluxTime(), "t_passed");
}

}  // namespace temb::models::families
