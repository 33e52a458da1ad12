// diffusers' SanaTransformer2DModel: Sana and Sana-Sprint.
#include <string>
#include <vector>

#include "builders.h"
#include "registry.h"

namespace temb::models::families {

FamilyDescription Sana() {
  FamilyDescription family = NewFamily("SanaTransformer2DModel", "sana");
  family.inputs = {
      {"t", "", "",
       "the scheduler's timesteps (0..1000); Sana-Sprint: the transformer's "
       "timestep, sin(t) / (cos(t) + sin(t)) of SCMScheduler's t"},
      {"guidance", "", "guidance_embeds",
       "the pipeline's guidance scale (Sana-Sprint)"},
      // time_embed receives the forward's timestep (and Sana-Sprint's
      // guidance) before its embedder runs.
      CapturedAt("time_embed", "timestep", ForwardTimestep("t_model")),
      EmbedderGuidance("time_embed", "guidance"),
  };
  std::vector<Op>& ops = family.ops;
  // SanaPipeline: t.expand(B) * transformer.config.timestep_scale, in
  // float32.  SanaSprintPipeline computes its timestep from SCMScheduler's
  // t itself (sin / (cos + sin), float32) and does not scale it.
  ops.push_back(Cast("t_given", "t", ValueDType::kFloat32));
  Op scaled = Multiply("t_model", "t_given", 1);
  scaled.constant_field = "timestep_scale";
  ops.push_back(When("!guidance_embeds", InFloat32(scaled)));
  ops.push_back(When("guidance_embeds",
                     Cast("t_model", "t_given", ValueDType::kFloat32)));
  // Both embedders: Timesteps(256, flip, shift 0) in float32, cast to
  // hidden_states' dtype, then a TimestepEmbedding.
  AppendSinusoidInModelDType(&ops, "t");
  // AdaLayerNormSingle's embedder, as PixArt-Sigma's.
  AppendMlp(&ops, "temb", "t_proj", "time_embed.emb.timestep_embedder",
            "!guidance_embeds");
  // Sana-Sprint's SanaCombinedTimestepGuidanceEmbeddings: the pipeline's
  // guidance.to(dtype) * config.guidance_embeds_scale (a product in the
  // model's dtype), embedded beside t; the two summed in the model's dtype
  // are temb, and time_embed.linear reads them as AdaLayerNormSingle's.
  AppendMlp(&ops, "t_emb", "t_proj", "time_embed.timestep_embedder",
            "guidance_embeds");
  ops.push_back(When("guidance_embeds",
                     Cast("g_model_dtype", "guidance", ValueDType::kModel)));
  Op guidance_scaled = Multiply("g_model", "g_model_dtype", 0.1);
  guidance_scaled.constant_field = "guidance_embeds_scale";
  ops.push_back(When("guidance_embeds", guidance_scaled));
  AppendSinusoidInModelDType(&ops, "g", "guidance_embeds");
  AppendMlp(&ops, "g_emb", "g_proj", "time_embed.guidance_embedder",
            "guidance_embeds");
  ops.push_back(When("guidance_embeds", Add("temb", "t_emb", "g_emb")));
  // SanaTransformerBlock: scale_shift_table[None] + timestep.reshape(B, 6,
  // -1); SanaModulatedNorm: scale_shift_table[None] + temb[:, None].
  AppendAdaLayerNormSingle(&family, "time_embed");
  ReturnedBy(&family, "embedded_timestep", "time_embed.emb",
             "!guidance_embeds");
  // Sana-Sprint: the guidance embedder runs after the timestep embedder,
  // and the sum of the two is the served temb.
  ReturnedBy(&family, "embedded_timestep", "time_embed.guidance_embedder",
             "guidance_embeds");
  family.folded = {{"time_embed.timestep_embedder", FoldedKind::kAddsNothing,
                    "guidance_embeds"}};
  return family;
}

}  // namespace temb::models::families
