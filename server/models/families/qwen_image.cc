// diffusers' QwenImageTransformer2DModel: Qwen-Image, its Edit and Layered
// models.
#include <string>
#include <vector>

#include "builders.h"
#include "registry.h"

namespace temb::models::families {

FamilyDescription QwenImage() {
  FamilyDescription family =
      NewFamily("QwenImageTransformer2DModel", "qwen-image");
  // The guidance branch raises in diffusers 0.42.1 itself.  Edit-2511's
  // zero_cond_t needs nothing here: the model stacks the rows of t and of
  // t * 0 (0 after the bf16 rounding, as t >= 0) through the same ops, and
  // its reference image's tokens read img_mod's second half.  Rows are
  // batch-invariant, so the row a caller asks for at timestep 0 is that
  // half, bit for bit.
  family.unsupported_flags = {"guidance_embeds"};
  // Read, so that the model publishes it (a transformer offloaded with this
  // model's rows must have the same): every value is computed alike.
  family.requirements = {{"zero_cond_t", "false", -1, {"true", "null"}}};
  family.inputs = {
      {"t", "", "", "the scheduler's timesteps (0..1000)"},
      CapturedAt("time_text_embed", "addition_t_cond",
                 {"addition_t_cond", "", "use_additional_t_cond",
                  "Qwen-Image-Layered's row of addition_t_embedding, 0 or 1 "
                  "(its pipeline passes 0)",
                  2}),
      // The embedder receives the forward's timestep, and Edit-2511's
      // zero_cond_t rows of t * 0 after it: captured there.
      CapturedAt("time_text_embed", "timestep", ForwardTimestep("t_model")),
  };
  std::vector<Op>& ops = family.ops;
  // Pipeline: t.expand(B).to(latents.dtype), then timestep / 1000 in that
  // dtype; the model casts to hidden_states' dtype again (a no-op).
  ops.push_back(Cast("t_pipeline", "t", ValueDType::kModel));
  ops.push_back(Divide("t_model", "t_pipeline", 1000));
  // QwenTimestepProjEmbeddings: Timesteps(256, flip, shift 0, scale=1000),
  // so the 1000 multiplies the float32 angle, not t.
  ops.push_back(Sinusoid("t_sinus", "t_model", 1000));
  ops.push_back(Cast("t_proj", "t_sinus", ValueDType::kModel));
  AppendMlp(&ops, "t_emb", "t_proj", "time_text_embed.timestep_embedder");
  ops.push_back(When("!use_additional_t_cond",
                     Cast("temb", "t_emb", ValueDType::kModel)));
  // Layered: + addition_t_embedding(index).to(dtype), a sum in the model's
  // dtype.
  Op addition = MakeOp(OpKind::kEmbedding, "addition_emb", {"addition_t_cond"});
  addition.weight = "time_text_embed.addition_t_embedding.weight";
  addition.table_shape = {2};
  ops.push_back(When("use_additional_t_cond", addition));
  ops.push_back(
      When("use_additional_t_cond", Add("temb", "t_emb", "addition_emb")));
  ops.push_back(Silu("temb_silu", "temb"));
  family.outputs = {{"temb", "temb", "[N, D]"}};
  // img_mod / txt_mod = Sequential(SiLU, Linear(D, 6D)): key ".1".
  AppendDualStreamModulation(&family, "transformer_blocks.{i}.img_mod.1",
                             "transformer_blocks.{i}.img_mod.0",
                             "transformer_blocks.{i}.txt_mod.1",
                             "transformer_blocks.{i}.txt_mod.0",
                             "shift1, scale1, gate1, shift2, scale2, gate2");
  // AdaLayerNormContinuous: linear(SiLU(temb).to(x.dtype)); temb is already
  // in the model's dtype.
  ops.push_back(AdaNormLinear("norm_out", "temb_silu", "norm_out", 2));
  family.outputs.push_back({"norm_out", "norm_out", "[N, 2D]: scale, shift"});
  ReturnedBy(&family, "temb", "time_text_embed");
  return family;
}

}  // namespace temb::models::families
