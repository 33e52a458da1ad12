// diffusers' ChromaTransformer2DModel: Chroma.
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "builders.h"
#include "registry.h"

namespace temb::models::families {

// Chroma: no modulation Linear in any block; the distilled guidance layer
// (an MLP over 344 rows for the released config, one per modulation
// vector) computes them all from t.
FamilyDescription Chroma() {
  FamilyDescription family = NewFamily("ChromaTransformer2DModel", "chroma");
  // The released approximator: 64 input channels (a 16-wide sinusoid of t
  // and of guidance 0, beside each index's 32-wide one) and 5 layers,
  // which this description unrolls.
  family.requirements = {{"approximator_num_channels", "64"},
                         {"approximator_layers", "5"}};
  family.inputs = {{"t", "", "", "the scheduler's timesteps (0..1000)"},
                   ForwardTimestep("t_passed"),
                   // Runs before the approximator, the replaced embedder.
                   EmbedderTimestep("time_text_embed.time_proj", "timesteps")};
  // One modulation vector per index: 3 per single block, 6 per stream per
  // double block, 2 for the output norm.
  const std::string indices = "3 * num_single_layers + 12 * num_layers + 2";
  std::vector<Op>& ops = family.ops;
  // FLUX.1's pipeline and model: t.to(dtype) / 1000, then * 1000.
  ops = FluxTime();
  // ChromaCombinedTimestepTextProjEmbeddings: Timesteps(16, flip, shift 0)
  // of t and of a guidance of 0, each cast to t's dtype, side by side...
  AppendZerosLike(&ops, "g_model", "g_signed", "t_model");
  for (const char* name : {"t", "g"}) {
    ops.push_back(SinusoidOfSize(absl::StrCat(name, "_sinus"),
                                 absl::StrCat(name, "_model"), "16"));
    ops.push_back(Cast(absl::StrCat(name, "_proj"),
                       absl::StrCat(name, "_sinus"), ValueDType::kModel));
  }
  ops.push_back(Concat("tg_proj", {"t_proj", "g_proj"}));
  // ...beside each index's row of the mod_proj buffer, which diffusers
  // builds at load (not in the checkpoint): Timesteps(32, flip, shift 0) of
  // index * 1000 in float32, cast to the model's dtype.
  Op index = MakeOp(OpKind::kRange, "index_model", {"t_model"});
  index.dtype = ValueDType::kFloat32;
  index.constant = 1000;
  index.width_field = indices;
  ops.push_back(index);
  ops.push_back(SinusoidOfSize("index_sinus", "index_model", "32"));
  ops.push_back(Cast("index_proj", "index_sinus", ValueDType::kModel));
  Op input =
      MakeOp(OpKind::kRepeatBeside, "approx_in", {"tg_proj", "index_proj"});
  input.groups_field = indices;
  ops.push_back(input);
  // ChromaApproximator, one row per index: in_proj, then 5 times
  // x + linear_2(SiLU(linear_1(RMSNorm(x)))), then out_proj (D wide).
  auto grouped = [&](Op op) {
    op.groups_field = indices;
    return op;
  };
  auto hidden = [&](std::string out, std::string in, std::string weight) {
    Op op = Linear(std::move(out), std::move(in), std::move(weight), 1);
    op.width_field = "approximator_hidden_dim";
    return grouped(op);
  };
  const std::string layer = "distilled_guidance_layer";
  ops.push_back(hidden("approx_0", "approx_in", layer + ".in_proj"));
  for (int j = 0; j < 5; ++j) {
    const std::string x = absl::StrCat("approx_", j);
    const std::string at = absl::StrCat(layer, ".layers.", j);
    Op norm = MakeOp(OpKind::kRmsNorm, x + "_norm", {x});
    norm.weight = absl::StrCat(layer, ".norms.", j, ".weight");
    ops.push_back(grouped(norm));
    ops.push_back(hidden(x + "_h", x + "_norm", at + ".linear_1"));
    ops.push_back(Silu(x + "_a", x + "_h"));
    ops.push_back(hidden(x + "_o", x + "_a", at + ".linear_2"));
    ops.push_back(Add(absl::StrCat("approx_", j + 1), x, x + "_o"));
  }
  ops.push_back(
      grouped(Linear("pooled_temb", "approx_5", layer + ".out_proj", 1)));
  OutputSpec output = {"pooled_temb", "pooled_temb",
                       "[N, I, D]: per index; single block i: 3i..3i+2 "
                       "(shift, scale, gate); double block i: image "
                       "3L_single + 6i.., text 3L_single + 6L + 6i..; "
                       "the output norm: the last two (shift, scale)"};
  output.chunks_field = indices;
  // The approximator returns every modulation vector; no block has a
  // modulation Linear.
  output.replaces = layer;
  family.outputs = {output};
  return family;
}

}  // namespace temb::models::families
