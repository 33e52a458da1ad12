// diffusers' LTXVideoTransformer3DModel: LTX-Video.
#include <string>
#include <vector>

#include "builders.h"
#include "registry.h"

namespace temb::models::families {

FamilyDescription Ltx() {
  FamilyDescription family =
      NewFamily("LTXVideoTransformer3DModel", "ltx-video");
  family.inputs = {
      {"t", "", "", "the scheduler's timesteps (0..1000)"},
      CapturedAt("time_embed.emb", "timestep", ForwardTimestep("t_model"))};
  std::vector<Op>& ops = family.ops;
  // Pipelines: t.expand(B) (image-to-video: per token, t * (1 - mask)),
  // float32 as the scheduler gives it; the model embeds timestep.flatten()
  // with PixArt's embedder, without size conditions: Timesteps(256, flip,
  // shift 0) in float32, cast to hidden_states' dtype.
  ops.push_back(Cast("t_model", "t", ValueDType::kFloat32));
  AppendSinusoidInModelDType(&ops, "t");
  AppendMlp(&ops, "temb", "t_proj", "time_embed.emb.timestep_embedder");
  // LTXVideoTransformerBlock adds its table as [None, None] to temb viewed
  // [B, T, 6, D], and the output its table to embedded_timestep [B, T, 1,
  // D]: per row the same sums as PixArt's.
  AppendAdaLayerNormSingle(&family, "time_embed");
  ReturnedBy(&family, "embedded_timestep", "time_embed.emb");
  return family;
}

}  // namespace temb::models::families
