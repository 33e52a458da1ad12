// diffusers' HunyuanVideoTransformer3DModel: HunyuanVideo (1.0), its
// image-to-video models; HunyuanVideoFramepackTransformer3DModel.
#include <string>
#include <vector>

#include "builders.h"
#include "flux1.h"
#include "registry.h"

namespace temb::models::families {

// HunyuanVideo (1.0): HunyuanVideoConditionEmbedding sums t_emb + g_emb +
// p_emb in FLUX.1's order, its blocks and output norm are FLUX.1's.  The
// pipeline passes t.expand(B).to(latents.dtype), float32, embedded as it
// is.  The image-to-video token_replace variant also embeds the row of
// t = 0 without guidance for the first frame's tokens: not served here.
FamilyDescription HunyuanVideo() {
  FamilyDescription family =
      Flux1Like("HunyuanVideoTransformer3DModel", "hunyuanvideo",
                {Cast("t_model", "t", ValueDType::kFloat32)}, "t_model");
  // HunyuanVideo-I2V's latent_concat adds the image to the latents only.
  family.requirements = {{"image_condition_type",
                          "null",
                          -1,
                          {"\"latent_concat\"", "\"token_replace\""}}};
  // Its token_replace embeds a second row for the first frame's tokens:
  // token_replace_emb = timestep_embedder(time_proj(zeros_like(t))) + the
  // pooled MLP, without guidance, read by the same image and single-stream
  // modulation Linears as temb (HunyuanVideoTokenReplaceAdaLayerNormZero and
  // ...Single); the text stream and norm_out read temb alone.
  const std::string replace = "image_condition_type=\"token_replace\"";
  std::vector<Op>& ops = family.ops;
  AppendZerosLike(&ops, "tr_model", "tr_signed", "t_model", replace);
  AppendSinusoidInModelDType(&ops, "tr", replace);
  AppendMlp(&ops, "tr_t_emb", "tr_proj", "time_text_embed.timestep_embedder",
            replace);
  ops.push_back(When(replace, Add("tr_temb", "tr_t_emb", "p_emb")));
  ops.push_back(When(replace, Silu("tr_temb_silu", "tr_temb")));
  ops.push_back(When(
      replace, Linear("tr_img_mod", "tr_temb_silu",
                      "transformer_blocks.{i}.norm1.linear", 6, "num_layers")));
  ops.push_back(
      When(replace, Linear("tr_single_mod", "tr_temb_silu",
                           "single_transformer_blocks.{i}.norm.linear", 3,
                           "num_single_layers")));
  family.outputs.push_back({"tr_temb", "tr_temb",
                            "[N, D]: token_replace_emb (the first frame's)", 0,
                            replace});
  family.outputs.push_back({"tr_img_mod", "tr_img_mod",
                            "[N, L, 6D]: img_mod of token_replace_emb", 0,
                            replace});
  family.outputs.push_back(
      {"tr_single_mod", "tr_single_mod",
       "[N, L_single, 3D]: single_mod of token_replace_emb", 0, replace});
  for (OutputSpec& output : family.outputs) {
    if (output.name == "tr_img_mod" || output.name == "tr_single_mod") {
      output.embedding = "tr_temb";
    }
  }
  // HunyuanVideoConditionEmbedding returns (temb, token_replace_emb), the
  // second None without token_replace.
  ReturnedBy(&family, "tr_temb", "time_text_embed", replace);
  family.embedder_results = {"temb", "tr_temb"};
  return family;
}

// HunyuanVideo-FramePack: the same HunyuanVideoConditionEmbedding, and the
// same blocks and output norm reading its temb; its pipeline passes the
// scheduler's float32 t.expand(B).  The history and clean latents join the
// sequence with no timestep of their own, and the image embedding joins
// the text tokens.  The forward keeps the embedder's first result (`temb,
// _ =`), so a token_replace row would be thrown away: none is served.
FamilyDescription HunyuanVideoFramepack() {
  FamilyDescription family = Flux1Like(
      "HunyuanVideoFramepackTransformer3DModel", "hunyuanvideo-framepack",
      {Cast("t_model", "t", ValueDType::kFloat32)}, "t_model");
  family.embedder_results = {"temb", ""};
  return family;
}

}  // namespace temb::models::families
