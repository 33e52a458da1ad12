// diffusers' UNet2DConditionModel as SDXL configures it.
#include <string>
#include <utility>
#include <vector>

#include "builders.h"
#include "registry.h"

namespace temb::models::families {
namespace {

// A Linear whose output width is a config expression.
Op LinearOfWidth(std::string out, std::string in, std::string weight,
                 std::string width, std::string blocks) {
  Op op = Linear(std::move(out), std::move(in), std::move(weight), 1,
                 std::move(blocks));
  op.width_field = std::move(width);
  return op;
}

}  // namespace

// SDXL's UNet: three down blocks, the mid block, three up blocks.  Other
// UNet layouts (SD 1.x/2.x have no added embedding; the SDXL refiner has
// four levels and five time ids) are refused by the requirements below.
FamilyDescription SdxlUnet() {
  FamilyDescription family;
  family.class_name = "UNet2DConditionModel";
  family.name = "sdxl-unet";
  // D is time_embed_dim (time_embedding_dim is required to be null).
  family.width_fields = {"block_out_channels[0] * 4"};
  family.requirements = {
      {"addition_embed_type", "\"text_time\""},
      {"time_embedding_type", "\"positional\""},
      {"time_embedding_dim", "null"},
      {"time_embedding_act_fn", "null"},
      {"timestep_post_act", "null"},
      {"time_cond_proj_dim", "null"},  // LCM's timestep_cond
      {"class_embed_type", "null"},
      {"num_class_embeds", "null"},
      {"act_fn", "\"silu\""},
      {"flip_sin_to_cos", "true"},
      {"freq_shift", "0"},
      {"resnet_time_scale_shift", "\"default\""},
      {"resnet_skip_time_act", "false"},
      {"mid_block_type", "\"UNetMidBlock2DCrossAttn\""},
      {"down_block_types",
       R"(["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"])"},
      {"up_block_types",
       R"(["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"])"},
      {"block_out_channels", "", 3},
  };
  family.inputs = {
      {"t", "", "", "the scheduler's timesteps"},
      CapturedAt("", "added_cond_kwargs[text_embeds]",
                 {"pooled",
                  "projection_class_embeddings_input_dim - 6 * "
                  "addition_time_embed_dim",
                  "",
                  "the pooled text embedding (added_cond_kwargs "
                  "text_embeds)"}),
      CapturedAt(
          "", "added_cond_kwargs[time_ids]",
          InModelDType(
              {"time_ids", "6", "",
               "the added time ids: original size, crop top-left, target "
               "size"})),
      // time_proj runs before add_embedding, the replaced embedder.
      CapturedAt("time_proj", "timesteps", ForwardTimestep("t_model")),
  };
  std::vector<Op>& ops = family.ops;
  // The pipeline passes the scheduler's float32 t as it is;
  // get_time_embed: time_proj = Timesteps(block_out_channels[0], flip,
  // shift 0), cast to sample.dtype.
  ops.push_back(Cast("t_model", "t", ValueDType::kFloat32));
  ops.push_back(SinusoidOfSize("t_sinus", "t_model", "block_out_channels[0]"));
  ops.push_back(Cast("t_proj", "t_sinus", ValueDType::kModel));
  AppendMlp(&ops, "t_emb", "t_proj", "time_embedding");
  // get_aug_embed ("text_time"): the pipeline's time ids and pooled
  // embedding are in the model's dtype; add_time_proj embeds each id in
  // float32; concat with the pooled embedding promotes to float32, then
  // .to(emb.dtype).
  ops.push_back(Cast("time_ids_model", "time_ids", ValueDType::kModel));
  ops.push_back(SinusoidOfSize("time_ids_sinus", "time_ids_model",
                               "addition_time_embed_dim"));
  ops.push_back(Cast("pooled_model", "pooled", ValueDType::kModel));
  ops.push_back(Concat("add_in_float", {"pooled_model", "time_ids_sinus"},
                       ValueDType::kFloat32));
  ops.push_back(Cast("add_in", "add_in_float", ValueDType::kModel));
  AppendMlp(&ops, "aug_emb", "add_in", "add_embedding");
  // emb = emb + aug_emb; no time_embed_act.
  ops.push_back(Add("temb", "t_emb", "aug_emb"));
  // Every ResnetBlock2D: time_emb_proj(SiLU(emb)), out_channels wide.
  ops.push_back(Silu("temb_silu", "temb"));
  for (int b = 0; b < 3; ++b) {
    const std::string down = "down_blocks." + std::to_string(b);
    ops.push_back(LinearOfWidth(
        down, "temb_silu", down + ".resnets.{i}.time_emb_proj",
        "block_out_channels[" + std::to_string(b) + "]", "layers_per_block"));
  }
  // UNetMidBlock2DCrossAttn with one attention layer: two resnets.
  ops.push_back(LinearOfWidth("mid_block", "temb_silu",
                              "mid_block.resnets.{i}.time_emb_proj",
                              "block_out_channels[-1]", "2"));
  for (int b = 0; b < 3; ++b) {
    const std::string up = "up_blocks." + std::to_string(b);
    ops.push_back(
        LinearOfWidth(up, "temb_silu", up + ".resnets.{i}.time_emb_proj",
                      "block_out_channels[" + std::to_string(2 - b) + "]",
                      "layers_per_block + 1"));
  }
  family.outputs = {{"temb", "temb", "[N, T]: time_embedding + add_embedding"}};
  // The forward adds time_embedding's result to add_embedding's, the
  // embedder, which runs last; a resnet's nonlinearity also acts on its
  // hidden states, so no time_emb_proj names an input module.
  ReturnedBy(&family, "temb", "add_embedding");
  family.folded = {{"time_embedding", FoldedKind::kAddsNothing}};
  for (const char* level : {"down_blocks", "up_blocks"}) {
    for (int b = 0; b < 3; ++b) {
      const std::string name = std::string(level) + "." + std::to_string(b);
      family.outputs.push_back(
          {name, name, "[N, resnets, C]: resnets.{j}.time_emb_proj"});
    }
    if (std::string(level) == "down_blocks") {
      family.outputs.push_back(
          {"mid_block", "mid_block", "[N, 2, C]: resnets.{j}.time_emb_proj"});
    }
  }
  return family;
}

}  // namespace temb::models::families
