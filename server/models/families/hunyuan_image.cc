// diffusers' HunyuanImageTransformer2DModel: HunyuanImage-2.1, FLUX.1's
// blocks over a time embedding with the distilled model's guidance and the
// MeanFlow model's second timestep.
#include <vector>

#include "builders.h"
#include "registry.h"

namespace temb::models::families {

FamilyDescription HunyuanImage() {
  FamilyDescription family =
      NewFamily("HunyuanImageTransformer2DModel", "hunyuanimage-2.1");
  family.inputs = {
      {"t", "", "", "the scheduler's timesteps (0..1000)"},
      {"guidance", "", "guidance_embeds",
       "the distilled guidance scale (the pipeline passes it times 1000)"},
      CapturedAt(
          "time_guidance_embed", "timestep_r",
          InModelDType({"timestep_r", "", "use_meanflow",
                        "MeanFlow's next timestep (0 at the last step)"})),
      CapturedAt("time_guidance_embed", "timestep", ForwardTimestep("t_model")),
      EmbedderGuidance("time_guidance_embed", "guidance"),
  };
  std::vector<Op>& ops = family.ops;
  // HunyuanImagePipeline: t.expand(B).to(latents.dtype), the model's dtype;
  // HunyuanImageCombinedTimeGuidanceEmbedding: each Timesteps(256, flip,
  // shift 0) in float32, cast to the timestep's dtype, then its MLP.
  ops.push_back(Cast("t_model", "t", ValueDType::kModel));
  AppendSinusoidInModelDType(&ops, "t");
  AppendMlp(&ops, "t_emb", "t_proj", "time_guidance_embed.timestep_embedder");
  // MeanFlow: (temb + temb_r) / 2 in the model's dtype.
  const std::string meanflow = "use_meanflow";
  ops.push_back(
      When(meanflow, Cast("r_model", "timestep_r", ValueDType::kModel)));
  AppendSinusoidInModelDType(&ops, "r", meanflow);
  AppendMlp(&ops, "r_emb", "r_proj", "time_guidance_embed.timestep_embedder_r",
            meanflow);
  ops.push_back(When(meanflow, Add("tr_emb", "t_emb", "r_emb")));
  ops.push_back(When(meanflow, Divide("t_mean", "tr_emb", 2)));
  ops.push_back(
      When("!" + meanflow, Cast("t_mean", "t_emb", ValueDType::kModel)));
  // The distilled model: the pipeline's scale in the transformer's dtype
  // times 1000 there, through the same time_proj and its own MLP.
  const std::string guided = "guidance_embeds";
  ops.push_back(When(guided, Cast("g_dtype", "guidance", ValueDType::kModel)));
  ops.push_back(When(guided, Multiply("g_model", "g_dtype", 1000)));
  AppendSinusoidInModelDType(&ops, "g", guided);
  AppendMlp(&ops, "g_emb", "g_proj", "time_guidance_embed.guidance_embedder",
            guided);
  ops.push_back(When(guided, Add("temb", "t_mean", "g_emb")));
  ops.push_back(When("!" + guided, Cast("temb", "t_mean", ValueDType::kModel)));
  ops.push_back(Silu("temb_silu", "temb"));
  family.outputs = {{"temb", "temb", "[N, D]"}};
  // The token refiner (context_embedder) embeds t with the prompt's pooled
  // states: per prompt, not computed here.
  AppendFluxModulation(&family);
  ReturnedBy(&family, "temb", "time_guidance_embed");
  return family;
}

}  // namespace temb::models::families
