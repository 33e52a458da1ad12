// diffusers' Flux2Transformer2DModel: FLUX.2.
#include <string>
#include <tuple>
#include <vector>

#include "builders.h"
#include "registry.h"

namespace temb::models::families {

FamilyDescription Flux2() {
  FamilyDescription family = NewFamily("Flux2Transformer2DModel", "flux.2");
  family.inputs = {
      {"t", "", "", "the scheduler's timesteps (0..1000)"},
      {"guidance", "", "guidance_embeds", "the guidance scale (dev)"},
      ForwardTimestep("t_passed"),
      // Its KV-cache mode embeds the reference tokens' fixed timestep too.
      EmbedderTimestep("time_guidance_embed", "timestep"),
      EmbedderGuidance("time_guidance_embed", "guidance"),
  };
  std::vector<Op>& ops = family.ops;
  // Every Linear here is built with bias=False.
  auto mlp = [&ops](const std::string& out, const std::string& in,
                    const std::string& prefix, const std::string& when) {
    ops.push_back(
        When(when, NoBias(Linear(out + "_h", in, prefix + ".linear_1", 1))));
    ops.push_back(When(when, Silu(out + "_a", out + "_h")));
    ops.push_back(
        When(when, NoBias(Linear(out, out + "_a", prefix + ".linear_2", 1))));
  };
  // Pipeline: t.expand(B).to(latents.dtype), passed as timestep / 1000;
  // the model: timestep.to(hidden_states.dtype) * 1000, in that dtype.
  ops.push_back(Cast("t_pipeline", "t", ValueDType::kModel));
  ops.push_back(Divide("t_passed", "t_pipeline", 1000));
  ops.push_back(Multiply("t_model", "t_passed", 1000));
  // Flux2TimestepGuidanceEmbeddings: Timesteps(256, flip, shift 0), the
  // float32 sinusoid cast to timestep.dtype (the model's).
  AppendSinusoidInModelDType(&ops, "t");
  mlp("t_emb", "t_proj", "time_guidance_embed.timestep_embedder", "");
  // dev: the pipeline's float32 guidance, guidance.to(hidden_states.dtype)
  // * 1000 in the model, embedded by the same time_proj.
  ops.push_back(When("guidance_embeds",
                     Cast("g_model_dtype", "guidance", ValueDType::kModel)));
  ops.push_back(
      When("guidance_embeds", Multiply("g_model", "g_model_dtype", 1000)));
  AppendSinusoidInModelDType(&ops, "g", "guidance_embeds");
  mlp("g_emb", "g_proj", "time_guidance_embed.guidance_embedder",
      "guidance_embeds");
  ops.push_back(When("guidance_embeds", Add("temb", "t_emb", "g_emb")));
  ops.push_back(
      When("!guidance_embeds", Cast("temb", "t_emb", ValueDType::kModel)));
  ops.push_back(Silu("temb_silu", "temb"));
  // Flux2Modulation: linear(SiLU(temb)), one Linear each, shared by every
  // double block (image and text streams) and by every single block.
  // Flux2Modulation names its SiLU act_fn.
  for (const auto& [out, module, width_d] :
       {std::tuple("img_mod", "double_stream_modulation_img", 6),
        std::tuple("txt_mod", "double_stream_modulation_txt", 6),
        std::tuple("single_mod", "single_stream_modulation", 3)}) {
    ops.push_back(
        FedBy(std::string(module) + ".act_fn",
              NoBias(Linear(out, "temb_silu", std::string(module) + ".linear",
                            width_d))));
  }
  // AdaLayerNormContinuous(bias=False): linear(SiLU(temb).to(x.dtype)).
  ops.push_back(NoBias(AdaNormLinear("norm_out", "temb_silu", "norm_out", 2)));
  family.outputs = {
      {"temb", "temb", "[N, D]"},
      {"img_mod", "img_mod",
       "[N, 6D], shared by every double block: shift, scale, gate (attention), "
       "shift, scale, gate (feed-forward)"},
      {"txt_mod", "txt_mod", "[N, 6D]: same order, text stream"},
      {"single_mod", "single_mod",
       "[N, 3D], shared by every single block: shift, scale, gate"},
      {"norm_out", "norm_out", "[N, 2D]: scale, shift"},
  };
  ReturnedBy(&family, "temb", "time_guidance_embed");
  return family;
}

}  // namespace temb::models::families
