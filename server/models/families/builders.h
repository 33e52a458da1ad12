// The helpers the family files share: an op of each kind, and the op runs
// several families compute alike.  A helper used by one family lives in
// that family's file.
#ifndef TEMB_MODELS_FAMILIES_BUILDERS_H_
#define TEMB_MODELS_FAMILIES_BUILDERS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "temb/models/family.h"

namespace temb::models::families {

// A family of the diffusers class `class_name`, called `name`, whose width
// D is the product of the config fields `width_fields`.
FamilyDescription NewFamily(std::string class_name, std::string name,
                            std::vector<std::string> width_fields = {
                                "num_attention_heads", "attention_head_dim"});

// A Linear built with bias=False: only its weight is read.
Op NoBias(Op op);

// The transformer forward's timestep argument `argument` as the pipeline
// passes it, given instead of the scheduler's t: it stands for `value`,
// the description's value of it (InputSpec::stands_for).
InputSpec ForwardTimestep(const std::string& value,
                          const std::string& argument = "timestep");

// `input`, captured by an offload patch where the transformer's module
// `module` ("" for its own forward) receives it as `argument`
// (InputSpec::module, ::argument).
InputSpec CapturedAt(std::string module, std::string argument, InputSpec input);

// `input`, which the pipeline passes in the model's dtype
// (InputSpec::in_model_dtype).
InputSpec InModelDType(InputSpec input);

// The timestep the time embedder `module` receives as `argument` (the
// description's "t_model", the sinusoid's input), where that is not the
// forward's timestep: given instead of t, captured there.
InputSpec EmbedderTimestep(const std::string& module,
                           const std::string& argument);

// The guidance the embedder `module` receives as `argument` ("g_model"),
// given instead of the pipeline's guidance scale, captured there.
InputSpec EmbedderGuidance(const std::string& module,
                           const std::string& argument,
                           const std::string& when = "guidance_embeds");

Op MakeOp(OpKind kind, std::string out, std::vector<std::string> in);

Op Cast(std::string out, std::string in, ValueDType dtype);

Op Divide(std::string out, std::string in, double constant);

Op Multiply(std::string out, std::string in, double constant);

Op SubtractFrom(std::string out, std::string in, double constant);

// An op of a pipeline's float32 arithmetic on t, rounded to float32
// whatever the model's dtype.
Op InFloat32(Op op);

// An op of a module diffusers' from_pretrained keeps in float32
// (`_keep_in_fp32_modules`): its tensors are read as float32 and it
// computes in float32.
Op KeptFloat32(Op op);

// get_timestep_embedding always computes in float32.
Op Sinusoid(std::string out, std::string in, double scale);

// A sinusoid whose size is a config expression.
Op SinusoidOfSize(std::string out, std::string in, std::string dim);

Op Linear(std::string out, std::string in, std::string weight, int width_d,
          std::string blocks = "");

Op Silu(std::string out, std::string in);

Op Add(std::string out, std::string a, std::string b);

Op When(std::string flag, Op op);

// A modulation Linear whose input the transformer's parameterless module
// `input_module` hands it (Op::input_module: the SiLU before it).
Op FedBy(std::string input_module, Op op);

// diffusers' AdaLayerNormZero, ...ZeroSingle, ...Continuous and
// SD35AdaLayerNormZeroX all compute linear(silu(emb)): the Linear
// `prefix`.linear of `in`, fed by `prefix`.silu.
Op AdaNormLinear(std::string out, std::string in, const std::string& prefix,
                 int width_d, std::string blocks = "");

// Output `output` is what the transformer's module `module` returns (the
// embedder an offload replaces: OutputSpec::replaces), where the config
// flag `when` holds; a second call with another flag adds that flag's
// alternative (Sana and Sana-Sprint embed t in different modules).
void ReturnedBy(FamilyDescription* family, const std::string& output,
                const std::string& module, const std::string& when = "");

// in + the checkpoint tensor `table` of shape lead + [D], rounded to dtype.
Op TableAdd(std::string out, std::string in, std::string table,
            std::vector<int64_t> lead, ValueDType dtype,
            std::string blocks = "");

// in[0], in[1], ... side by side, rounded to `dtype`.
Op Concat(std::string out, std::vector<std::string> in,
          ValueDType dtype = ValueDType::kModel);

// diffusers' Timesteps(256, flip, shift 0) of `<name>_model` in float32
// (`<name>_sinus`), cast to the model's dtype (`<name>_proj`): an
// embedder's time_proj(x).to(dtype), in every family that embeds so.
void AppendSinusoidInModelDType(std::vector<Op>* ops, const std::string& name,
                                const std::string& when = "");

// TimestepEmbedding: linear_2(SiLU(linear_1(x))), all in the model's dtype.
void AppendMlp(std::vector<Op>* ops, const std::string& out,
               const std::string& in, const std::string& prefix,
               const std::string& when = "");

// TimestepEmbedding whose width is not D: `field`'s value, or D / div with
// `groups` rows per input row (see Op::groups).
void AppendMlpOf(std::vector<Op>* ops, const std::string& out,
                 const std::string& in, const std::string& prefix,
                 const std::string& field, int div, int groups,
                 const std::string& when);

// SD3's and HiDream-I1's temb: the MLP `t_mlp` of the sinusoid of the
// scheduler's float32 t (the pipelines pass it uncast) plus the MLP
// `pooled_mlp` of the pipeline's pooled embedding (in the model's dtype),
// summed in the model's dtype; then temb_silu.
void AppendFloat32TimePlusPooled(std::vector<Op>* ops, const std::string& t_mlp,
                                 const std::string& pooled_mlp);

// FLUX.1's (and Chroma's) t: the pipeline passes t.expand(B).to(
// latents.dtype) / 1000, the model embeds timestep.to(hidden_states.dtype)
// * 1000, each in that dtype.
std::vector<Op> FluxTime();

// zeros_like(in), a float32 value, as `out`: in * 0 (`signed`), then 0
// minus that, +0 whatever in's sign.
void AppendZerosLike(std::vector<Op>* ops, const std::string& out,
                     const std::string& signed_zero, const std::string& in,
                     const std::string& when = "");

// diffusers' AdaLayerNormZero order, FLUX.1's and HunyuanVideo-1.5's.
inline constexpr char kAdaLayerNormZeroChunks[] =
    "shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp";

// A dual-stream block's modulation: block i's image and text Linears
// (`img_key`, `txt_key` with "{i}", fed by the SiLUs `img_silu` and
// `txt_silu`), each 6D wide on SiLU(temb), stacked over num_layers as
// outputs img_mod and txt_mod with `chunks` in order.
void AppendDualStreamModulation(FamilyDescription* family,
                                const std::string& img_key,
                                const std::string& img_silu,
                                const std::string& txt_key,
                                const std::string& txt_silu,
                                const std::string& chunks);

// AppendDualStreamModulation of every block's AdaLayerNormZero pair,
// transformer_blocks.{i}.norm1 (image) and .norm1_context (text): FLUX.1's
// double blocks and HunyuanVideo-1.5's blocks.
void AppendAdaLayerNormZeroStreams(FamilyDescription* family);

// FLUX.1's modulation of temb_silu: AppendAdaLayerNormZeroStreams, every
// single block's AdaLayerNormZeroSingle (single_mod, over
// num_single_layers) and the output's AdaLayerNormContinuous (norm_out):
// FLUX.1, HunyuanVideo and the models built like them.
void AppendFluxModulation(FamilyDescription* family);

// AdaLayerNormSingle `prefix` after its embedder (value "temb", the
// embedded timestep): linear(silu(temb)), one Linear D -> 6D shared by every
// block, each block's scale_shift_table (6, D) added to it, and the
// output's table (2, D) added to temb, every sum in the model's dtype
// (PixArt's BasicTransformerBlock and LTX-Video's blocks).
void AppendAdaLayerNormSingle(FamilyDescription* family,
                              const std::string& prefix);

}  // namespace temb::models::families

#endif  // TEMB_MODELS_FAMILIES_BUILDERS_H_
