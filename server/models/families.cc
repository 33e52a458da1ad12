// The families, as data.  Each op cites the diffusers 0.42.1 code it
// mirrors; the parity tests (tests/models/test_conditioning_parity.py) run
// that code and compare.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "temb/models/family.h"

namespace temb::models {
namespace {

Op MakeOp(OpKind kind, std::string out, std::vector<std::string> in) {
  Op op;
  op.kind = kind;
  op.out = std::move(out);
  op.in = std::move(in);
  return op;
}

Op Cast(std::string out, std::string in, ValueDType dtype) {
  Op op = MakeOp(OpKind::kCast, std::move(out), {std::move(in)});
  op.dtype = dtype;
  return op;
}

Op Divide(std::string out, std::string in, double constant) {
  Op op = MakeOp(OpKind::kDivide, std::move(out), {std::move(in)});
  op.constant = constant;
  return op;
}

Op Multiply(std::string out, std::string in, double constant) {
  Op op = MakeOp(OpKind::kMultiply, std::move(out), {std::move(in)});
  op.constant = constant;
  return op;
}

Op SubtractFrom(std::string out, std::string in, double constant) {
  Op op = MakeOp(OpKind::kSubtractFrom, std::move(out), {std::move(in)});
  op.constant = constant;
  return op;
}

// An op of a pipeline's float32 arithmetic on t, rounded to float32
// whatever the model's dtype.
Op InFloat32(Op op) {
  op.dtype = ValueDType::kFloat32;
  return op;
}

// get_timestep_embedding always computes in float32.
Op Sinusoid(std::string out, std::string in, double scale) {
  Op op = MakeOp(OpKind::kSinusoid, std::move(out), {std::move(in)});
  op.dtype = ValueDType::kFloat32;
  op.sinusoid.scale = scale;
  return op;
}

Op Linear(std::string out, std::string in, std::string weight, int width_d,
          std::string blocks = "") {
  Op op = MakeOp(OpKind::kLinear, std::move(out), {std::move(in)});
  op.weight = std::move(weight);
  op.width_d = width_d;
  op.blocks = std::move(blocks);
  return op;
}

Op Silu(std::string out, std::string in) {
  return MakeOp(OpKind::kSilu, std::move(out), {std::move(in)});
}

Op Add(std::string out, std::string a, std::string b) {
  return MakeOp(OpKind::kAdd, std::move(out), {std::move(a), std::move(b)});
}

Op Select(BlockSelect select, Op op, std::string block_list = "") {
  op.select = select;
  op.block_list = std::move(block_list);
  return op;
}

Op When(std::string flag, Op op) {
  op.when = std::move(flag);
  return op;
}

// diffusers' Timesteps(256, flip, shift 0) of `<name>_model` in float32
// (`<name>_sinus`), cast to the model's dtype (`<name>_proj`): an
// embedder's time_proj(x).to(dtype), in every family that embeds so.
void AppendSinusoidInModelDType(std::vector<Op>* ops, const std::string& name,
                                const std::string& when = "") {
  ops->push_back(When(when, Sinusoid(name + "_sinus", name + "_model", 1)));
  ops->push_back(
      When(when, Cast(name + "_proj", name + "_sinus", ValueDType::kModel)));
}

// TimestepEmbedding: linear_2(SiLU(linear_1(x))), all in the model's dtype.
void AppendMlp(std::vector<Op>* ops, const std::string& out,
               const std::string& in, const std::string& prefix,
               const std::string& when = "") {
  ops->push_back(When(when, Linear(out + "_h", in, prefix + ".linear_1", 1)));
  ops->push_back(When(when, Silu(out + "_a", out + "_h")));
  ops->push_back(When(when, Linear(out, out + "_a", prefix + ".linear_2", 1)));
}

// SD3's and HiDream-I1's temb: the MLP `t_mlp` of the sinusoid of the
// scheduler's float32 t (the pipelines pass it uncast) plus the MLP
// `pooled_mlp` of the pipeline's pooled embedding (in the model's dtype),
// summed in the model's dtype; then temb_silu.
void AppendFloat32TimePlusPooled(std::vector<Op>* ops, const std::string& t_mlp,
                                 const std::string& pooled_mlp) {
  ops->push_back(Cast("t_model", "t", ValueDType::kFloat32));
  AppendSinusoidInModelDType(ops, "t");
  AppendMlp(ops, "t_emb", "t_proj", t_mlp);
  ops->push_back(Cast("pooled_model", "pooled", ValueDType::kModel));
  AppendMlp(ops, "p_emb", "pooled_model", pooled_mlp);
  ops->push_back(Add("temb", "t_emb", "p_emb"));
  ops->push_back(Silu("temb_silu", "temb"));
}

// The modules diffusers' from_pretrained keeps in float32: their tensors are
// read as float32 and the op computes in float32.
Op KeptFloat32(Op op) {
  op.weight_dtype = ValueDType::kFloat32;
  op.dtype = ValueDType::kFloat32;
  return op;
}

// in + the checkpoint tensor `table` of shape lead + [D], rounded to dtype.
Op TableAdd(std::string out, std::string in, std::string table,
            std::vector<int64_t> lead, ValueDType dtype,
            std::string blocks = "") {
  Op op = MakeOp(OpKind::kTableAdd, std::move(out), {std::move(in)});
  op.weight = std::move(table);
  op.table_shape = std::move(lead);
  op.dtype = dtype;
  op.blocks = std::move(blocks);
  return op;
}

// in[0], in[1], ... side by side, rounded to `dtype`.
Op Concat(std::string out, std::vector<std::string> in,
          ValueDType dtype = ValueDType::kModel) {
  Op op = MakeOp(OpKind::kConcat, std::move(out), std::move(in));
  op.dtype = dtype;
  return op;
}

// TimestepEmbedding whose width is not D: `field`'s value, or D / div with
// `groups` rows per input row (see Op::groups).
void AppendMlpOf(std::vector<Op>* ops, const std::string& out,
                 const std::string& in, const std::string& prefix,
                 const std::string& field, int div, int groups,
                 const std::string& when) {
  Op first = Linear(out + "_h", in, prefix + ".linear_1", 1);
  Op second = Linear(out, out + "_a", prefix + ".linear_2", 1);
  for (Op* op : {&first, &second}) {
    op->width_field = field;
    op->width_div = div;
    op->groups = groups;
    op->when = when;
  }
  ops->push_back(std::move(first));
  ops->push_back(When(when, Silu(out + "_a", out + "_h")));
  ops->push_back(std::move(second));
}

// A dual-stream block's modulation: block i's image and text Linears
// (`img_key`, `txt_key` with "{i}"), each 6D wide on SiLU(temb), stacked
// over num_layers as outputs img_mod and txt_mod with `chunks` in order.
void AppendDualStreamModulation(FamilyDescription* family,
                                const std::string& img_key,
                                const std::string& txt_key,
                                const std::string& chunks) {
  family->ops.push_back(
      Linear("img_mod", "temb_silu", img_key, 6, "num_layers"));
  family->ops.push_back(
      Linear("txt_mod", "temb_silu", txt_key, 6, "num_layers"));
  family->outputs.push_back({"img_mod", "img_mod", "[N, L, 6D]: " + chunks});
  family->outputs.push_back(
      {"txt_mod", "txt_mod", "[N, L, 6D]: same order, text stream"});
}

// diffusers' AdaLayerNormZero order, FLUX.1's and HunyuanVideo-1.5's.
constexpr char kAdaLayerNormZeroChunks[] =
    "shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp";

FamilyDescription QwenImage() {
  FamilyDescription family;
  family.class_name = "QwenImageTransformer2DModel";
  family.name = "qwen-image";
  family.width_fields = {"num_attention_heads", "attention_head_dim"};
  // The guidance branch raises in diffusers 0.42.1 itself.  Edit-2511's
  // zero_cond_t needs nothing here: the model stacks the rows of t and of
  // t * 0 (0 after the bf16 rounding, as t >= 0) through the same ops, and
  // its reference image's tokens read img_mod's second half.  Rows are
  // batch-invariant, so the row a caller asks for at timestep 0 is that
  // half, bit for bit.
  family.unsupported_flags = {"guidance_embeds"};
  family.inputs = {
      {"t", "", "", "the scheduler's timesteps (0..1000)"},
      {"addition_t_cond", "", "use_additional_t_cond",
       "Qwen-Image-Layered's row of addition_t_embedding, 0 or 1 (its "
       "pipeline passes 0)",
       2},
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
                             "transformer_blocks.{i}.txt_mod.1",
                             "shift1, scale1, gate1, shift2, scale2, gate2");
  // AdaLayerNormContinuous: linear(SiLU(temb).to(x.dtype)); temb is already
  // in the model's dtype.
  ops.push_back(Linear("norm_out", "temb_silu", "norm_out.linear", 2));
  family.outputs.push_back({"norm_out", "norm_out", "[N, 2D]: scale, shift"});
  return family;
}

// FLUX.1's conditioning after `time_ops`, which give t_model from the
// scheduler's t as the family's pipeline and model compute it; HunyuanVideo
// (1.0) computes the same from its own t.
FamilyDescription Flux1Like(std::string class_name, std::string name,
                            std::vector<Op> time_ops) {
  FamilyDescription family;
  family.class_name = std::move(class_name);
  family.name = std::move(name);
  family.width_fields = {"num_attention_heads", "attention_head_dim"};
  family.inputs = {
      {"t", "", "", "the scheduler's timesteps (0..1000)"},
      {"guidance", "", "guidance_embeds", "the guidance scale (dev)"},
      {"pooled", "pooled_projection_dim", "", "the pooled CLIP text embedding"},
  };
  std::vector<Op>& ops = family.ops;
  ops = std::move(time_ops);
  // CombinedTimestep(Guidance)TextProjEmbeddings: Timesteps(256, flip,
  // shift 0), the float32 sinusoid cast to the pooled projection's dtype.
  AppendSinusoidInModelDType(&ops, "t");
  AppendMlp(&ops, "t_emb", "t_proj", "time_text_embed.timestep_embedder");
  // Guidance: a float32 tensor from the pipeline, then
  // guidance.to(hidden_states.dtype) * 1000 in the model.
  ops.push_back(When("guidance_embeds",
                     Cast("g_model_dtype", "guidance", ValueDType::kModel)));
  ops.push_back(
      When("guidance_embeds", Multiply("g_model", "g_model_dtype", 1000)));
  AppendSinusoidInModelDType(&ops, "g", "guidance_embeds");
  AppendMlp(&ops, "g_emb", "g_proj", "time_text_embed.guidance_embedder",
            "guidance_embeds");
  // (t + g) first, then + pooled: each sum rounded to the model's dtype.
  ops.push_back(When("guidance_embeds", Add("tg_emb", "t_emb", "g_emb")));
  ops.push_back(
      When("!guidance_embeds", Cast("tg_emb", "t_emb", ValueDType::kModel)));
  // The pipeline's pooled embedding is in the model's dtype.
  ops.push_back(Cast("pooled_model", "pooled", ValueDType::kModel));
  AppendMlp(&ops, "p_emb", "pooled_model", "time_text_embed.text_embedder");
  ops.push_back(Add("temb", "tg_emb", "p_emb"));
  ops.push_back(Silu("temb_silu", "temb"));
  family.outputs = {{"temb", "temb", "[N, D]"}};
  // AdaLayerNormZero (norm1, norm1_context) and AdaLayerNormZeroSingle.
  AppendDualStreamModulation(&family, "transformer_blocks.{i}.norm1.linear",
                             "transformer_blocks.{i}.norm1_context.linear",
                             kAdaLayerNormZeroChunks);
  ops.push_back(Linear("single_mod", "temb_silu",
                       "single_transformer_blocks.{i}.norm.linear", 3,
                       "num_single_layers"));
  ops.push_back(Linear("norm_out", "temb_silu", "norm_out.linear", 2));
  family.outputs.push_back(
      {"single_mod", "single_mod", "[N, L_single, 3D]: shift, scale, gate"});
  family.outputs.push_back({"norm_out", "norm_out", "[N, 2D]: scale, shift"});
  return family;
}

// FLUX.1's (and Chroma's) t: the pipeline passes t.expand(B).to(
// latents.dtype) / 1000, the model embeds timestep.to(hidden_states.dtype)
// * 1000, each in that dtype.
std::vector<Op> FluxTime() {
  return {Cast("t_pipeline", "t", ValueDType::kModel),
          Divide("t_passed", "t_pipeline", 1000),
          Multiply("t_model", "t_passed", 1000)};
}

// zeros_like(in), a float32 value, as `out`: in * 0 (`signed`), then 0
// minus that, +0 whatever in's sign.
void AppendZerosLike(std::vector<Op>* ops, const std::string& out,
                     const std::string& signed_zero, const std::string& in,
                     const std::string& when = "") {
  ops->push_back(When(when, InFloat32(Multiply(signed_zero, in, 0))));
  ops->push_back(When(when, InFloat32(SubtractFrom(out, signed_zero, 0))));
}

FamilyDescription Flux1() {
  return Flux1Like("FluxTransformer2DModel", "flux.1", FluxTime());
}

// HunyuanVideo (1.0): HunyuanVideoConditionEmbedding sums t_emb + g_emb +
// p_emb in FLUX.1's order, its blocks and output norm are FLUX.1's.  The
// pipeline passes t.expand(B).to(latents.dtype), float32, embedded as it
// is.  The image-to-video token_replace variant also embeds the row of
// t = 0 without guidance for the first frame's tokens: not served here.
FamilyDescription HunyuanVideo() {
  FamilyDescription family =
      Flux1Like("HunyuanVideoTransformer3DModel", "hunyuanvideo",
                {Cast("t_model", "t", ValueDType::kFloat32)});
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
  return family;
}

FamilyDescription Sd3() {
  FamilyDescription family;
  family.class_name = "SD3Transformer2DModel";
  family.name = "sd3";
  family.width_fields = {"num_attention_heads", "attention_head_dim"};
  family.inputs = {
      {"t", "", "", "the scheduler's timesteps (0..1000)"},
      {"pooled", "pooled_projection_dim", "",
       "the pooled CLIP-L and CLIP-G text embedding"},
  };
  std::vector<Op>& ops = family.ops;
  // Pipeline: timestep = t.expand(B), the scheduler's float32 t with no
  // cast; CombinedTimestepTextProjEmbeddings: Timesteps(256, flip, shift 0)
  // of that float32 t, cast to the pooled projection's dtype.
  // PixArtAlphaTextProjection(act_fn="silu") is the same MLP as
  // TimestepEmbedding.
  AppendFloat32TimePlusPooled(&ops, "time_text_embed.timestep_embedder",
                              "time_text_embed.text_embedder");
  // JointTransformerBlock i: norm1 is SD35AdaLayerNormZeroX (9D) when i is
  // in dual_attention_layers, else AdaLayerNormZero (6D); norm1_context is
  // AdaLayerNormZero except in the last block (context_pre_only), where it
  // is AdaLayerNormContinuous (2D).  Each width is its own output.
  ops.push_back(
      Select(BlockSelect::kUnlisted,
             Linear("img_mod", "temb_silu",
                    "transformer_blocks.{i}.norm1.linear", 6, "num_layers"),
             "dual_attention_layers"));
  ops.push_back(
      Select(BlockSelect::kListed,
             Linear("img_mod_dual", "temb_silu",
                    "transformer_blocks.{i}.norm1.linear", 9, "num_layers"),
             "dual_attention_layers"));
  ops.push_back(Select(
      BlockSelect::kAllButLast,
      Linear("txt_mod", "temb_silu",
             "transformer_blocks.{i}.norm1_context.linear", 6, "num_layers")));
  // AdaLayerNormContinuous: linear(SiLU(temb).to(x.dtype)), a no-op cast.
  ops.push_back(Select(
      BlockSelect::kLast,
      Linear("txt_mod_last", "temb_silu",
             "transformer_blocks.{i}.norm1_context.linear", 2, "num_layers")));
  ops.push_back(Linear("norm_out", "temb_silu", "norm_out.linear", 2));
  family.outputs = {
      {"temb", "temb", "[N, D]"},
      {"img_mod", "img_mod",
       "[N, L - L_dual, 6D], the blocks not in dual_attention_layers: "
       "shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp"},
      {"img_mod_dual", "img_mod_dual",
       "[N, L_dual, 9D], the blocks in dual_attention_layers: the same six, "
       "then shift_msa2, scale_msa2, gate_msa2"},
      {"txt_mod", "txt_mod",
       "[N, L - 1, 6D], blocks 0 .. L-2: same order as img_mod, text stream"},
      {"txt_mod_last", "txt_mod_last",
       "[N, 2D], block L-1 (context_pre_only): scale, shift"},
      {"norm_out", "norm_out", "[N, 2D]: scale, shift"},
  };
  return family;
}

FamilyDescription Wan() {
  FamilyDescription family;
  family.class_name = "WanTransformer3DModel";
  family.name = "wan";
  family.width_fields = {"num_attention_heads", "attention_head_dim"};
  family.inputs = {{"t", "", "", "the scheduler's timesteps (0..1000)"}};
  std::vector<Op>& ops = family.ops;
  // Pipeline: timestep = t.expand(B), the scheduler's t with no cast;
  // WanTimeTextImageEmbedding: Timesteps(freq_dim, flip, shift 0) in
  // float32.
  ops.push_back(Cast("t_model", "t", ValueDType::kFloat32));
  Op sinus = Sinusoid("t_sinus", "t_model", 1);
  sinus.sinusoid.dim_field = "freq_dim";
  ops.push_back(sinus);
  // time_embedder is in _keep_in_fp32_modules: from_pretrained(torch_dtype)
  // leaves it float32, and the sinusoid is cast to its weights' dtype, so
  // the MLP runs in float32 in a bf16 model; then .type_as(the text
  // embedding), the model's dtype.
  ops.push_back(KeptFloat32(Linear(
      "temb_h", "t_sinus", "condition_embedder.time_embedder.linear_1", 1)));
  ops.push_back(KeptFloat32(Silu("temb_a", "temb_h")));
  ops.push_back(KeptFloat32(Linear(
      "temb_f32", "temb_a", "condition_embedder.time_embedder.linear_2", 1)));
  ops.push_back(Cast("temb", "temb_f32", ValueDType::kModel));
  // time_proj(act_fn(temb)): one Linear D -> 6D shared by every block, in
  // the model's dtype (time_proj is not a kept module).
  ops.push_back(Silu("temb_silu", "temb"));
  ops.push_back(
      Linear("timestep_proj", "temb_silu", "condition_embedder.time_proj", 6));
  // WanTransformerBlock: scale_shift_table (1, 6, D), kept float32, +
  // temb.float(): a float32 sum.
  ops.push_back(KeptFloat32(TableAdd("block_mod", "timestep_proj",
                                     "blocks.{i}.scale_shift_table", {1, 6},
                                     ValueDType::kFloat32, "num_layers")));
  // Output norm: scale_shift_table (1, 2, D) + temb.unsqueeze(1), the raw
  // bf16 temb promoted to float32 by the float32 table.
  ops.push_back(KeptFloat32(TableAdd("norm_out", "temb", "scale_shift_table",
                                     {1, 2}, ValueDType::kFloat32)));
  family.outputs = {
      {"temb", "temb", "[N, D]", 0},
      {"timestep_proj", "timestep_proj", "[N, 6, D]: time_proj's output", 6},
      {"block_mod", "block_mod",
       "[N, L, 6, D] float32: shift_msa, scale_msa, gate_msa, c_shift_msa, "
       "c_scale_msa, c_gate_msa",
       6},
      {"norm_out", "norm_out", "[N, 2, D] float32: shift, scale", 2},
  };
  return family;
}

FamilyDescription HiDream() {
  FamilyDescription family;
  family.class_name = "HiDreamImageTransformer2DModel";
  family.name = "hidream-i1";
  family.width_fields = {"num_attention_heads", "attention_head_dim"};
  family.inputs = {
      {"t", "", "", "the scheduler's timesteps (0..1000)"},
      {"pooled", "text_emb_dim", "",
       "the pooled CLIP-L + CLIP-G text embedding"},
  };
  std::vector<Op>& ops = family.ops;
  // Pipeline: t.expand(B), the scheduler's float32 t; HiDreamImage-
  // TimestepEmbed: Timesteps(256, flip, shift 0) in float32, cast to
  // hidden_states' dtype, then its MLP.
  // HiDreamImagePooledEmbed: an MLP of the pipeline's pooled embedding.
  AppendFloat32TimePlusPooled(&ops, "t_embedder.timestep_embedder",
                              "p_embedder.pooled_embedder");
  // adaLN_modulation = Sequential(SiLU, Linear): 12D in the double-stream
  // blocks (image then text), 6D in the single-stream ones, 2D at the end.
  ops.push_back(Linear("double_mod", "temb_silu",
                       "double_stream_blocks.{i}.block.adaLN_modulation.1", 12,
                       "num_layers"));
  ops.push_back(Linear("single_mod", "temb_silu",
                       "single_stream_blocks.{i}.block.adaLN_modulation.1", 6,
                       "num_single_layers"));
  ops.push_back(
      Linear("final_mod", "temb_silu", "final_layer.adaLN_modulation.1", 2));
  family.outputs = {
      {"temb", "temb", "[N, D]"},
      {"double_mod", "double_mod",
       "[N, L, 12D]: shift_msa_i, scale_msa_i, gate_msa_i, shift_mlp_i, "
       "scale_mlp_i, gate_mlp_i, then the same six for the text stream (_t)"},
      {"single_mod", "single_mod",
       "[N, L_single, 6D]: shift_msa, scale_msa, gate_msa, shift_mlp, "
       "scale_mlp, gate_mlp"},
      {"final_mod", "final_mod", "[N, 2D]: shift, scale"},
  };
  return family;
}

// AdaLayerNormSingle `prefix` after its embedder (value "temb", the
// embedded timestep): linear(silu(temb)), one Linear D -> 6D shared by every
// block, each block's scale_shift_table (6, D) added to it, and the
// output's table (2, D) added to temb, every sum in the model's dtype
// (PixArt's BasicTransformerBlock and LTX-Video's blocks).
void AppendAdaLayerNormSingle(FamilyDescription* family,
                              const std::string& prefix) {
  std::vector<Op>& ops = family->ops;
  ops.push_back(Silu("temb_silu", "temb"));
  ops.push_back(Linear("timestep", "temb_silu", prefix + ".linear", 6));
  ops.push_back(TableAdd("block_mod", "timestep",
                         "transformer_blocks.{i}.scale_shift_table", {6},
                         ValueDType::kModel, "num_layers"));
  ops.push_back(TableAdd("norm_out", "temb", "scale_shift_table", {2},
                         ValueDType::kModel));
  family->outputs = {
      {"embedded_timestep", "temb", "[N, D]", 0},
      {"timestep", "timestep", "[N, 6D]: " + prefix + "'s Linear", 0},
      {"block_mod", "block_mod",
       "[N, L, 6, D]: shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, "
       "gate_mlp",
       6},
      {"norm_out", "norm_out", "[N, 2, D]: shift, scale", 2},
  };
}

FamilyDescription PixArt() {
  FamilyDescription family;
  family.class_name = "PixArtTransformer2DModel";
  family.name = "pixart";
  family.width_fields = {"num_attention_heads", "attention_head_dim"};
  // diffusers derives a null use_additional_conditions from sample_size
  // (True exactly at 128, PixArt-alpha's 1024 px models).
  family.flag_defaults = {{"use_additional_conditions", "sample_size", 128}};
  family.inputs = {
      {"t", "", "", "the scheduler's timesteps (0..1000)"},
      {"resolution", "2", "use_additional_conditions",
       "the image's height and width in pixels (PixArt-alpha)"},
      {"aspect_ratio", "", "use_additional_conditions",
       "height / width (PixArt-alpha)"},
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
  return family;
}

FamilyDescription Ltx() {
  FamilyDescription family;
  family.class_name = "LTXVideoTransformer3DModel";
  family.name = "ltx-video";
  family.width_fields = {"num_attention_heads", "attention_head_dim"};
  family.inputs = {{"t", "", "", "the scheduler's timesteps (0..1000)"}};
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
  return family;
}

FamilyDescription Sana() {
  FamilyDescription family;
  family.class_name = "SanaTransformer2DModel";
  family.name = "sana";
  family.width_fields = {"num_attention_heads", "attention_head_dim"};
  family.inputs = {
      {"t", "", "",
       "the scheduler's timesteps (0..1000); Sana-Sprint: the transformer's "
       "timestep, sin(t) / (cos(t) + sin(t)) of SCMScheduler's t"},
      {"guidance", "", "guidance_embeds",
       "the pipeline's guidance scale (Sana-Sprint)"},
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
  return family;
}

FamilyDescription ZImage() {
  FamilyDescription family;
  family.class_name = "ZImageTransformer2DModel";
  family.name = "z-image";
  family.width_fields = {"dim"};
  // One final layer, keyed "2-1": the released configs' only patch sizes.
  family.requirements = {{"all_patch_size", "[2]"},
                         {"all_f_patch_size", "[1]"}};
  family.inputs = {{"t", "", "", "the scheduler's timesteps (0..1000)"}};
  std::vector<Op>& ops = family.ops;
  // Pipeline: (1000 - t.expand(B)) / 1000 in float32; the model embeds
  // t * config.t_scale.
  ops.push_back(Cast("t_given", "t", ValueDType::kFloat32));
  ops.push_back(InFloat32(SubtractFrom("t_reversed", "t_given", 1000)));
  ops.push_back(InFloat32(Divide("t_pipeline", "t_reversed", 1000)));
  Op scaled = Multiply("t_model", "t_pipeline", 1000);
  scaled.constant_field = "t_scale";
  ops.push_back(InFloat32(scaled));
  // TimestepEmbedder: its own float32 sinusoid (the same formula as
  // Timesteps(256, flip, shift 0)), cast to its weights' dtype, then
  // mlp = Sequential(Linear(256, 1024), SiLU, Linear(1024, 256)): the time
  // embedding is min(D, 256) wide.
  AppendSinusoidInModelDType(&ops, "t");
  Op first = Linear("temb_h", "t_proj", "t_embedder.mlp.0", 1);
  first.width_field = "1024";
  ops.push_back(first);
  ops.push_back(Silu("temb_a", "temb_h"));
  Op second = Linear("temb", "temb_a", "t_embedder.mlp.2", 1);
  second.width_field = "256";
  ops.push_back(second);
  // Every modulated block's adaLN_modulation is one Linear of temb, no
  // SiLU (scale_msa, gate_msa, scale_mlp, gate_mlp; the block applies
  // 1 + scale and tanh); the final layer's is SiLU then Linear (scale).
  ops.push_back(Linear("refiner_mod", "temb",
                       "noise_refiner.{i}.adaLN_modulation.0", 4,
                       "n_refiner_layers"));
  ops.push_back(Linear("layer_mod", "temb", "layers.{i}.adaLN_modulation.0", 4,
                       "n_layers"));
  ops.push_back(Silu("temb_silu", "temb"));
  ops.push_back(Linear("final_mod", "temb_silu",
                       "all_final_layer.2-1.adaLN_modulation.1", 1));
  family.outputs = {
      {"temb", "temb", "[N, 256]"},
      {"refiner_mod", "refiner_mod",
       "[N, L_refiner, 4D]: scale_msa, gate_msa, scale_mlp, gate_mlp "
       "(noise_refiner)"},
      {"layer_mod", "layer_mod", "[N, L, 4D]: the same, layers"},
      {"final_mod", "final_mod", "[N, D]: scale"},
  };
  return family;
}

FamilyDescription Lumina2() {
  FamilyDescription family;
  family.class_name = "Lumina2Transformer2DModel";
  family.name = "lumina2";
  family.width_fields = {"hidden_size"};
  family.inputs = {{"t", "", "", "the scheduler's timesteps (0..1000)"}};
  std::vector<Op>& ops = family.ops;
  // Pipeline: 1 - t / num_train_timesteps (1000), in float32: t = 0 is the
  // noise; Timesteps(256, flip, shift 0) of it, with no factor 1000, cast
  // to hidden_states' dtype.
  ops.push_back(Cast("t_given", "t", ValueDType::kFloat32));
  ops.push_back(InFloat32(Divide("t_fraction", "t_given", 1000)));
  ops.push_back(InFloat32(SubtractFrom("t_model", "t_fraction", 1)));
  AppendSinusoidInModelDType(&ops, "t");
  // The time embedding is min(D, 1024) wide.
  AppendMlpOf(&ops, "temb", "t_proj", "time_caption_embed.timestep_embedder",
              "min(hidden_size, 1024)", 1, 1, "");
  ops.push_back(Silu("temb_silu", "temb"));
  // LuminaRMSNormZero of every modulated block: linear(silu(temb)), 4D
  // (scale_msa, gate_msa, scale_mlp, gate_mlp); LuminaLayerNormContinuous:
  // linear_1(silu(temb).to(x.dtype)), D (scale).
  ops.push_back(Linear("refiner_mod", "temb_silu",
                       "noise_refiner.{i}.norm1.linear", 4,
                       "num_refiner_layers"));
  ops.push_back(Linear("layer_mod", "temb_silu", "layers.{i}.norm1.linear", 4,
                       "num_layers"));
  ops.push_back(Linear("norm_out", "temb_silu", "norm_out.linear_1", 1));
  family.outputs = {
      {"temb", "temb", "[N, min(D, 1024)]"},
      {"refiner_mod", "refiner_mod",
       "[N, L_refiner, 4D]: scale_msa, gate_msa, scale_mlp, gate_mlp "
       "(noise_refiner)"},
      {"layer_mod", "layer_mod", "[N, L, 4D]: the same, layers"},
      {"norm_out", "norm_out", "[N, D]: scale"},
  };
  return family;
}

FamilyDescription HunyuanVideo15() {
  FamilyDescription family;
  family.class_name = "HunyuanVideo15Transformer3DModel";
  family.name = "hunyuanvideo-1.5";
  family.width_fields = {"num_attention_heads", "attention_head_dim"};
  family.inputs = {
      {"t", "", "", "the scheduler's timesteps (0..1000)"},
      {"timestep_r", "", "use_meanflow",
       "the next step's timestep, 0 at the last (the super-resolution "
       "MeanFlow model)"},
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
  AppendDualStreamModulation(&family, "transformer_blocks.{i}.norm1.linear",
                             "transformer_blocks.{i}.norm1_context.linear",
                             kAdaLayerNormZeroChunks);
  // AdaLayerNormContinuous: linear(SiLU(temb).to(x.dtype)), a no-op cast.
  ops.push_back(Linear("norm_out", "temb_silu", "norm_out.linear", 2));
  family.outputs.push_back({"norm_out", "norm_out", "[N, 2D]: scale, shift"});
  // The token refiner (context_embedder) is conditioned on t and the
  // prompt's masked mean; it is not computed here.
  return family;
}

FamilyDescription CogVideoX() {
  FamilyDescription family;
  family.class_name = "CogVideoXTransformer3DModel";
  family.name = "cogvideox";
  family.width_fields = {"num_attention_heads", "attention_head_dim"};
  family.inputs = {
      {"t", "", "", "the scheduler's timesteps (0..1000)"},
      {"ofs", "", "ofs_embed_dim",
       "the ofs value (CogVideoX 1.5 I2V; its pipeline passes 2.0)"},
  };
  std::vector<Op>& ops = family.ops;
  // Pipeline: t.expand(B), the scheduler's t; time_proj = Timesteps(D,
  // flip_sin_to_cos, freq_shift) from config.json, in float32, cast to
  // hidden_states' dtype.
  ops.push_back(Cast("t_model", "t", ValueDType::kFloat32));
  Op sinus = Sinusoid("t_sinus", "t_model", 1);
  sinus.sinusoid.dim_is_width = true;
  sinus.sinusoid.flip_field = "flip_sin_to_cos";
  sinus.sinusoid.shift_field = "freq_shift";
  ops.push_back(sinus);
  ops.push_back(Cast("t_proj", "t_sinus", ValueDType::kModel));
  // time_embedding: TimestepEmbedding(D, time_embed_dim).
  AppendMlpOf(&ops, "t_emb", "t_proj", "time_embedding", "time_embed_dim", 1, 1,
              "");
  // CogVideoX 1.5 I2V: the pipeline's ofs is latents.new_full((1,), 2.0),
  // in the latents' dtype; ofs_proj = Timesteps(ofs_embed_dim, ...), its
  // MLP ofs_embed_dim wide, added to the time embedding.
  const std::string ofs = "ofs_embed_dim";
  ops.push_back(When(ofs, Cast("ofs_model", "ofs", ValueDType::kModel)));
  Op ofs_sinus = When(ofs, Sinusoid("ofs_sinus", "ofs_model", 1));
  ofs_sinus.sinusoid.dim_field = ofs;
  ofs_sinus.sinusoid.flip_field = "flip_sin_to_cos";
  ofs_sinus.sinusoid.shift_field = "freq_shift";
  ops.push_back(ofs_sinus);
  ops.push_back(When(ofs, Cast("ofs_proj", "ofs_sinus", ValueDType::kModel)));
  AppendMlpOf(&ops, "ofs_emb", "ofs_proj", "ofs_embedding", ofs, 1, 1, ofs);
  ops.push_back(When(ofs, Add("temb", "t_emb", "ofs_emb")));
  ops.push_back(When("!" + ofs, Cast("temb", "t_emb", ValueDType::kModel)));
  ops.push_back(Silu("temb_silu", "temb"));
  // CogVideoXLayerNormZero: linear(silu(temb)), time_embed_dim -> 6D.
  ops.push_back(Linear("norm1", "temb_silu",
                       "transformer_blocks.{i}.norm1.linear", 6, "num_layers"));
  ops.push_back(Linear("norm2", "temb_silu",
                       "transformer_blocks.{i}.norm2.linear", 6, "num_layers"));
  // AdaLayerNorm(chunk_dim=1): linear(silu(temb)) -> 2D.
  ops.push_back(Linear("norm_out", "temb_silu", "norm_out.linear", 2));
  family.outputs = {
      {"temb", "temb", "[N, time_embed_dim]", 0},
      {"norm1", "norm1",
       "[N, L, 6D]: shift, scale, gate, enc_shift, enc_scale, enc_gate", 0},
      {"norm2", "norm2", "[N, L, 6D]: the same six, after attention", 0},
      {"norm_out", "norm_out", "[N, 2D]: shift, scale", 0},
  };
  return family;
}

// A Linear built with bias=False: only its weight is read.
Op NoBias(Op op) {
  op.has_bias = false;
  return op;
}

FamilyDescription Flux2() {
  FamilyDescription family;
  family.class_name = "Flux2Transformer2DModel";
  family.name = "flux.2";
  family.width_fields = {"num_attention_heads", "attention_head_dim"};
  family.inputs = {
      {"t", "", "", "the scheduler's timesteps (0..1000)"},
      {"guidance", "", "guidance_embeds", "the guidance scale (dev)"},
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
  ops.push_back(NoBias(Linear("img_mod", "temb_silu",
                              "double_stream_modulation_img.linear", 6)));
  ops.push_back(NoBias(Linear("txt_mod", "temb_silu",
                              "double_stream_modulation_txt.linear", 6)));
  ops.push_back(NoBias(
      Linear("single_mod", "temb_silu", "single_stream_modulation.linear", 3)));
  // AdaLayerNormContinuous(bias=False): linear(SiLU(temb).to(x.dtype)).
  ops.push_back(NoBias(Linear("norm_out", "temb_silu", "norm_out.linear", 2)));
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
  return family;
}

// A sinusoid whose size is a config expression.
Op SinusoidOfSize(std::string out, std::string in, std::string dim) {
  Op op = Sinusoid(std::move(out), std::move(in), 1);
  op.sinusoid.dim_field = std::move(dim);
  return op;
}

// A Linear whose output width is a config expression.
Op LinearOfWidth(std::string out, std::string in, std::string weight,
                 std::string width, std::string blocks) {
  Op op = Linear(std::move(out), std::move(in), std::move(weight), 1,
                 std::move(blocks));
  op.width_field = std::move(width);
  return op;
}

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
      {"pooled",
       "projection_class_embeddings_input_dim - 6 * "
       "addition_time_embed_dim",
       "", "the pooled text embedding (added_cond_kwargs text_embeds)"},
      {"time_ids", "6", "",
       "the added time ids: original size, crop top-left, target size"},
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

}  // namespace

// Chroma: no modulation Linear in any block; the distilled guidance layer
// (an MLP over 344 rows for the released config, one per modulation
// vector) computes them all from t.
FamilyDescription Chroma() {
  FamilyDescription family;
  family.class_name = "ChromaTransformer2DModel";
  family.name = "chroma";
  family.width_fields = {"num_attention_heads", "attention_head_dim"};
  // The released approximator: 64 input channels (a 16-wide sinusoid of t
  // and of guidance 0, beside each index's 32-wide one) and 5 layers,
  // which this description unrolls.
  family.requirements = {{"approximator_num_channels", "64"},
                         {"approximator_layers", "5"}};
  family.inputs = {{"t", "", "", "the scheduler's timesteps (0..1000)"}};
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
  family.outputs = {output};
  return family;
}

const std::vector<FamilyDescription>& Families() {
  static const auto* families = new std::vector<FamilyDescription>{
      QwenImage(), Flux1(),          Sd3(),    Wan(),      PixArt(),
      CogVideoX(), HunyuanVideo15(), Flux2(),  SdxlUnet(), Ltx(),
      HiDream(),   Sana(),           ZImage(), Lumina2(),  HunyuanVideo(),
      Chroma()};
  return *families;
}

const FamilyDescription* FindFamily(const std::string& class_name) {
  for (const FamilyDescription& family : Families()) {
    if (family.class_name == class_name) return &family;
  }
  return nullptr;
}

}  // namespace temb::models
