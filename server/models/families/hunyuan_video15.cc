// diffusers' HunyuanVideo15Transformer3DModel: HunyuanVideo-1.5.
#include <string>
#include <vector>

#include "builders.h"
#include "registry.h"

namespace temb::models::families {

FamilyDescription HunyuanVideo15() {
  FamilyDescription family =
      NewFamily("HunyuanVideo15Transformer3DModel", "hunyuanvideo-1.5");
  family.inputs = {
      {"t", "", "", "the scheduler's timesteps (0..1000)"},
      CapturedAt("time_embed", "timestep_r",
                 InModelDType({"timestep_r", "", "use_meanflow",
                               "the next step's timestep, 0 at the last (the "
                               "super-resolution MeanFlow model)"})),
      CapturedAt("time_embed", "timestep", ForwardTimestep("t_model")),
  };
  std::vector<Op>& ops = family.ops;
  // Pipeline: t.expand(B).to(latents.dtype) at the 0..1000 scale, passed to
  // the model as it is; with use_meanflow, timestep_r the same way.
  ops.push_back(Cast("t_model", "t", ValueDType::kModel));
  // HunyuanVideo15TimeEmbedding: Timesteps(256, flip, shift 0), the float32
  // sinusoid cast to timestep.dtype (the model's, as t was cast).
  AppendSinusoidInModelDType(&ops, "t");
  AppendMlp(&ops, "temb", "t_proj", "time_embed.timestep_embedder",
            "!use_meanflow");
  // MeanFlow (the super-resolution model): timestep_r embedded by its own
  // Timesteps and TimestepEmbedding, added to t's in the model's dtype.
  AppendMlp(&ops, "t_emb", "t_proj", "time_embed.timestep_embedder",
            "use_meanflow");
  ops.push_back(
      When("use_meanflow", Cast("r_model", "timestep_r", ValueDType::kModel)));
  AppendSinusoidInModelDType(&ops, "r", "use_meanflow");
  AppendMlp(&ops, "r_emb", "r_proj", "time_embed.timestep_embedder_r",
            "use_meanflow");
  ops.push_back(When("use_meanflow", Add("temb", "t_emb", "r_emb")));
  ops.push_back(Silu("temb_silu", "temb"));
  family.outputs = {{"temb", "temb", "[N, D]"}};
  // Every HunyuanVideo15TransformerBlock: AdaLayerNormZero norm1 (image)
  // and norm1_context (text), linear(SiLU(temb)).
  AppendAdaLayerNormZeroStreams(&family);
  // AdaLayerNormContinuous: linear(SiLU(temb).to(x.dtype)), a no-op cast.
  ops.push_back(AdaNormLinear("norm_out", "temb_silu", "norm_out", 2));
  family.outputs.push_back({"norm_out", "norm_out", "[N, 2D]: scale, shift"});
  ReturnedBy(&family, "temb", "time_embed");
  // The token refiner (context_embedder) is conditioned on t and the
  // prompt's masked mean; it is not computed here.
  return family;
}

}  // namespace temb::models::families
