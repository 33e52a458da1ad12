// What a model family computes between its inputs (the scheduler's
// timestep, a guidance scale, a pooled text embedding) and its blocks,
// written as data: a short list of ops over named values, read by one
// evaluator (conditioning_model.h).  Each family is one file of
// server/models/families/, listed in the one table behind Families()
// (families/registry.cc); adding a family is adding its file and its entry
// there.
//
// Values are [N] scalars or [N, W] rows (W per op, from config.json); a
// linear or table-add op stacked over `blocks` produces [N, L, W] with
// block i's tensors at checkpoint name `weight` with "{i}" replaced by i
// (`select` may take a subset of the blocks, see BlockSelect).  Every op rounds
// its result to its `dtype`: the model's dtype (the stored dtype of its
// weights) or float32; arithmetic on a bf16 value is computed in float32
// and rounded once, as PyTorch does on the CPU.
//
// Widths and block counts are read from config.json through small integer
// expressions: a field name ("num_layers"), a list entry
// ("block_out_channels[0]", "block_out_channels[-1]" for the last), an
// integer literal, + - * over those ("layers_per_block + 1",
// "projection_class_embeddings_input_dim - 6 * addition_time_embed_dim"),
// and min(a, b) ("min(hidden_size, 1024)").
// Every value must come out positive.
//
// A sinusoid of an [N, W] value embeds each of its W values and flattens
// the result to [N, W * dim] (SDXL's add_time_proj over the six time ids).
#ifndef TEMB_MODELS_FAMILY_H_
#define TEMB_MODELS_FAMILY_H_

#include <string>
#include <vector>

namespace temb::models {

enum class OpKind {
  kCast,          // in[0] rounded to dtype
  kDivide,        // in[0] / constant
  kMultiply,      // in[0] * constant
  kSubtractFrom,  // constant - in[0] (Z-Image's pipeline: 1000 - t)
  kSinusoid,      // diffusers' get_timestep_embedding of in[0] (see above)
  kLinear,        // in[0] W^T (+ b), W and b from the checkpoint
  kSilu,          // in[0] * sigmoid(in[0])
  kAdd,           // in[0] + in[1]
  // in[0] + a checkpoint tensor (`weight`, the full name) of shape
  // `table_shape` + [D]: in[0]'s row is repeated along the table when the
  // table is wider (Wan's and PixArt's scale_shift_table + temb).  Stacked
  // over `blocks` like a linear.
  kTableAdd,
  // The row of a checkpoint tensor (`weight`, the full name) of shape
  // [table_shape[0], D] that in[0], an index, picks (nn.Embedding:
  // Qwen-Image-Layered's addition_t_embedding).  in[0] is an input whose
  // InputSpec::index_count is that row count, so every index is checked
  // before any op runs.
  kEmbedding,
  // in[0], in[1], ... side by side in each row ([N, W0 + W1 + ...]; a
  // scalar input is one column), rounded to dtype.
  kConcat,
  // Constant rows [N, W]: column k holds k * constant, W the config
  // expression `width_field` (Chroma's modulation indices times 1000, whose
  // sinusoids diffusers keeps in a buffer); in[0] gives the row count.
  kRange,
  // Each of in[1]'s `groups` equal parts with in[0]'s row before it:
  // [N, groups * (W0 + W1 / groups)], rounded to dtype (Chroma's
  // approximator input, the time row beside each index's sinusoid).
  kRepeatBeside,
  // nn.RMSNorm (eps None) over each of in[0]'s `groups` equal parts, times
  // the checkpoint tensor `weight` (the full name): as PyTorch's CPU
  // rms_norm, x * rsqrt(mean(x^2) + the float32 epsilon) * weight in float32
  // whatever the dtype, rounded once to dtype.
  kRmsNorm,
};

// Where an op's result is rounded to.
enum class ValueDType { kFloat32, kModel };

// Which of a stacked linear's blocks it covers, in increasing index.  SD3
// builds its blocks unequal: the last one's context norm is narrower, and
// SD3.5's dual-attention blocks have a wider norm1.  Each width is its own
// op over its own blocks, so no output is padded.
enum class BlockSelect {
  kAll,         // every block
  kAllButLast,  // blocks 0 .. L-2
  kLast,        // block L-1 alone: an unstacked [N, W] value
  kListed,      // the blocks in the config list `block_list`
  kUnlisted,    // the blocks not in it
};

struct SinusoidParams {
  int dim = 256;
  bool flip_sin_to_cos = true;
  double downscale_freq_shift = 0;
  double scale = 1;
  double max_period = 10000;
  // Taken from config.json when set: the width (`dim_field`, a config
  // expression such as SDXL's "block_out_channels[0]", or D itself with
  // `dim_is_width`), flip_sin_to_cos and downscale_freq_shift.
  std::string dim_field;
  bool dim_is_width = false;
  std::string flip_field;
  std::string shift_field;
  std::string max_period_field;  // max_period (Bria's time_theta)
};

struct Op {
  OpKind kind = OpKind::kCast;
  std::string out;
  std::vector<std::string> in;
  ValueDType dtype = ValueDType::kModel;
  double constant = 0;  // kDivide, kMultiply, kSubtractFrom
  // kDivide, kMultiply, kSubtractFrom: the config.json number `constant_field`
  // instead, `constant` when the field is absent (Sana's timestep_scale).
  std::string constant_field;
  SinusoidParams sinusoid;  // kSinusoid
  std::string weight;       // kLinear: "<prefix>" for <prefix>.weight/.bias
  int width_d = 0;          // kLinear: output width, in multiples of D
  std::string blocks;       // kLinear: config field counting blocks, or ""
  BlockSelect select = BlockSelect::kAll;  // kLinear with `blocks`
  std::string block_list;  // kListed, kUnlisted: config field of indices
  // The op exists only when this config flag is true ("!flag": false);
  // empty: always.  A number counts as true when non-zero, null as false
  // (CogVideoX's ofs_embed_dim), unless FamilyDescription::flag_defaults
  // says otherwise.  "field=JSON" holds when the field equals that JSON
  // value, an absent field counting as null (HunyuanVideo's
  // image_condition_type="token_replace").
  std::string when;
  // What the op's checkpoint tensors are read as: the model's dtype, or
  // float32 for the modules diffusers' from_pretrained keeps in float32
  // (`_keep_in_fp32_modules`) whatever their stored dtype: an exact upcast
  // of a bf16 or fp16 tensor, so both stored forms give the loaded model's
  // values.  Such tensors do not set the model's dtype.
  ValueDType weight_dtype = ValueDType::kModel;
  std::vector<int64_t> table_shape;  // kTableAdd, kEmbedding: before D
  // kLinear output width, when not width_d * D: width_d times the config
  // expression `width_field` (CogVideoX's time_embed_dim, the UNet's
  // resnets' "block_out_channels[1]"), or width_d * (D / width_div),
  // rounded down (PixArt-alpha's size embedders: D // 3).
  std::string width_field;
  int width_div = 1;
  // kLinear: in[0]'s row is `groups` equal rows, each through the same
  // Linear, results side by side (diffusers' flatten -> Linear -> reshape
  // of PixArt-alpha's [N, 2] resolution); kRmsNorm, kRepeatBeside as
  // described there.
  int groups = 1;
  std::string groups_field;  // `groups` from this config expression instead
  // kLinear: false for a Linear built without a bias (FLUX.2): only
  // <prefix>.weight is read.  When true a missing <prefix>.bias refuses the
  // checkpoint.
  bool has_bias = true;
  // kLinear giving an output: the transformer's parameterless module (with
  // "{i}" as in `weight`) that hands the Linear its input, the SiLU before
  // it, which an offload passes through.  Empty where there is none, or
  // where that module also acts on other values (a UNet resnet's
  // nonlinearity acts on its hidden states too).
  std::string input_module;
};

// A config.json field the family's description assumes: `value` is the JSON
// it must equal (an absent field counts as null), or one of `also`; or, with
// `length` >= 0, the field must be a list of that many entries.  A model that
// differs is refused naming the field, rather than computed wrong.
struct ConfigRequirement {
  std::string field;
  std::string value;
  int length = -1;
  std::vector<std::string> also;  // more JSON values the description follows
};

// A model input: [N] when `width_field` is empty, else [N, W] with W the
// value of that config expression (a field name, or a literal: SDXL's "6"
// time ids, PixArt-alpha's "2" for height and width).
struct InputSpec {
  std::string name;
  std::string width_field;
  std::string when;  // as Op::when: required exactly when the flag holds
  std::string help;
  // > 0: each value is an index into a table of this many rows
  // (kEmbedding), an integer in [0, index_count).
  int index_count = 0;
  // Set: the input is the transformer forward's own timestep argument,
  // which the description computes from "t" (the scheduler's t) as this
  // value.  Given instead of "t", it is that value as it stands (each
  // element must be one of the value's dtype), and the pipeline's
  // arithmetic before it does not run.
  std::string stands_for;
  // Where an offload patch captures the input as the transformer hands it:
  // the module's qualified name ("" for the transformer's own forward) and
  // the argument's name in that module's forward ("name[key]" for an entry
  // of a dict argument).  Empty `argument`: the patch does not capture it.
  std::string module;
  std::string argument;
  // The pipeline hands it in the model's dtype, and the description rounds
  // it so; a transformer handed a value that dtype does not hold computes
  // otherwise (an offload patch refuses it).
  bool in_model_dtype = false;
  // Set by the loader for an input that stands for a value: the input that
  // value is computed from ("t", "guidance"), which a call giving this one
  // leaves out.
  std::string instead_of;
};

// One output, laid out as the model consumes it: [N, W] or, for a stacked
// value, [N, L, W], in the model's dtype, chunks in diffusers' order.  A
// stacked output whose selection has no block in a model (SD3.0 has no
// dual-attention blocks) is not produced for that model.
struct OutputSpec {
  std::string name;
  std::string value;
  std::string layout;  // documentation: the chunks, in order
  // > 0: the row is shown as [chunks, W / chunks], as the model reshapes
  // it (Wan's [N, 6, D] timestep_proj); the bytes are the same.
  int chunks = 0;
  std::string when;          // as Op::when: produced exactly when it holds
  std::string chunks_field;  // `chunks` from this config expression instead
  // The transformer module whose result this output is, where that is not
  // the Linear or table that computes it (an output of a Linear or table
  // add names that op's module by itself): the embedder that an offload
  // replaces, which returns this output.
  std::string replaces;
  // Where the embedder returns more than one result
  // (FamilyDescription::embedder_results): the result a replaced Linear or
  // table is handed; empty for the first.
  std::string embedding;
};

// What a transformer module with weights on the time path that is neither
// the embedder nor a Linear or table of an output contributes, once the
// outputs are served.
enum class FoldedKind {
  // Its result is the served value it is handed (Wan's time MLP between
  // the sinusoid, which the embedder replaces, and time_proj).
  kPassesOn,
  // The model adds its result to a value whose served form already holds
  // it (CogVideoX 1.5's ofs embedding, the UNet's time_embedding).
  kAddsNothing,
};

struct FoldedModule {
  std::string module;
  FoldedKind kind = FoldedKind::kPassesOn;
  std::string when;  // as Op::when: present exactly when it holds
};

// A flag that config.json may leave null, with the value diffusers derives
// then: `flag` is true exactly when the integer field `field` equals
// `equals` (PixArt's use_additional_conditions: sample_size == 128).
struct FlagDefault {
  std::string flag;
  std::string field;
  int64_t equals = 0;
};

struct FamilyDescription {
  std::string class_name;  // config.json's _class_name
  std::string name;        // short name for messages and docs
  // config.json fields (or expressions) whose product is the width D.
  std::vector<std::string> width_fields;
  // Boolean config.json fields that change the computation in ways this
  // description does not follow: a model with one of them true is refused
  // rather than computed wrong.
  std::vector<std::string> unsupported_flags;
  std::vector<InputSpec> inputs;
  std::vector<Op> ops;
  std::vector<OutputSpec> outputs;
  // The modules with weights the outputs fold in besides their own.
  std::vector<FoldedModule> folded;
  std::vector<FlagDefault> flag_defaults;
  std::vector<ConfigRequirement> requirements;
  // Where the replaced embedder returns a tuple: the output at each
  // position, an output this model lacks standing for None.  Empty: it
  // returns its output alone.
  std::vector<std::string> embedder_results;
};

// Every family temb knows.
const std::vector<FamilyDescription>& Families();

// The family whose class_name is `class_name`, or nullptr.
const FamilyDescription* FindFamily(const std::string& class_name);

}  // namespace temb::models

#endif  // TEMB_MODELS_FAMILY_H_
