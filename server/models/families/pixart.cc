// diffusers' PixArtTransformer2DModel: PixArt-alpha and PixArt-Sigma.
#include <string>
#include <vector>

#include "builders.h"
#include "registry.h"

namespace temb::models::families {

FamilyDescription PixArt() {
  FamilyDescription family = NewFamily("PixArtTransformer2DModel", "pixart");
  // diffusers derives a null use_additional_conditions from sample_size
  // (True exactly at 128, PixArt-alpha's 1024 px models).
  family.flag_defaults = {{"use_additional_conditions", "sample_size", 128}};
  family.inputs = {
      {"t", "", "", "the scheduler's timesteps (0..1000)"},
      CapturedAt(
          "adaln_single.emb", "resolution",
          InModelDType(
              {"resolution", "2", "use_additional_conditions",
               "the image's height and width in pixels (PixArt-alpha)"})),
      CapturedAt("adaln_single.emb", "aspect_ratio",
                 InModelDType({"aspect_ratio", "", "use_additional_conditions",
                               "height / width (PixArt-alpha)"})),
      CapturedAt("adaln_single.emb", "timestep", ForwardTimestep("t_model")),
  };
  std::vector<Op>& ops = family.ops;
  // Pipeline: current_timestep.expand(B), the scheduler's t with no cast;
  // PixArtAlphaCombinedTimestepSizeEmbeddings: Timesteps(256, flip, shift
  // 0) in float32, cast to hidden_states' dtype.
  ops.push_back(Cast("t_model", "t", ValueDType::kFloat32));
  AppendSinusoidInModelDType(&ops, "t");
  AppendMlp(&ops, "t_emb", "t_proj", "adaln_single.emb.timestep_embedder");
  // PixArt-alpha: the pipeline casts resolution [N, 2] and aspect_ratio
  // [N, 1] to the text embedding's dtype; each element's sinusoid, cast,
  // through its MLP of width D // 3 and reshaped to [N, -1]; the two are
  // concatenated and added to the timestep embedding.
  const std::string extra = "use_additional_conditions";
  ops.push_back(
      When(extra, Cast("res_model", "resolution", ValueDType::kModel)));
  AppendSinusoidInModelDType(&ops, "res", extra);
  AppendMlpOf(&ops, "res_emb", "res_proj",
              "adaln_single.emb.resolution_embedder", "", 3, 2, extra);
  ops.push_back(
      When(extra, Cast("ar_model", "aspect_ratio", ValueDType::kModel)));
  AppendSinusoidInModelDType(&ops, "ar", extra);
  AppendMlpOf(&ops, "ar_emb", "ar_proj",
              "adaln_single.emb.aspect_ratio_embedder", "", 3, 1, extra);
  ops.push_back(When(extra, Concat("size_emb", {"res_emb", "ar_emb"})));
  ops.push_back(When(extra, Add("temb", "t_emb", "size_emb")));
  ops.push_back(When("!" + extra, Cast("temb", "t_emb", ValueDType::kModel)));
  AppendAdaLayerNormSingle(&family, "adaln_single");
  ReturnedBy(&family, "embedded_timestep", "adaln_single.emb");
  return family;
}

}  // namespace temb::models::families
