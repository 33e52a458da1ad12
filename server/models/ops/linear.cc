// A Linear, in[0] W^T (+ b), with W and b from the checkpoint: one, or one
// per block of a stack (block i's tensors at the name with "{i}" replaced),
// on the CPU kernel over the checkpoint's bytes or on a LinearEngine.
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "config_expression.h"
#include "ops/units.h"
#include "temb/base/status_macros.h"

namespace temb::models::ops {
namespace {

// Every block's parameters stacked into one Linear of L * W outputs: one
// engine call and one pass over the weights per op, whose [N, L * W]
// result is the [N, L, W] value as it stands.  Each output element is its
// own dot product (linear.h), so stacking changes no bit.
class LinearOp : public PlannedOp {
 public:
  LinearOp(int64_t in_width, int64_t out_width, int64_t groups)
      : in_width_(in_width), out_width_(out_width), groups_(groups) {}

  // Appends the next block's parameters; `blocks` of them in all.
  void Add(DType dtype, const LoadedTensor& weight, const LoadedTensor& bias,
           int64_t blocks) {
    dtype_ = dtype;
    if (blocks_ == 0) {
      weight_.reserve(weight.data.size() * blocks);
      bias_.reserve(bias.data.size() * blocks);
    }
    weight_.insert(weight_.end(), weight.data.begin(), weight.data.end());
    bias_.insert(bias_.end(), bias.data.begin(), bias.data.end());
    ++blocks_;
  }
  int64_t blocks() const { return blocks_; }

  absl::Status Upload(LinearEngine& engine) override {
    LinearWeights weights;
    weights.weight = weight_;
    weights.bias = bias_;
    weights.dtype = dtype_;
    weights.in_features = in_width_;
    weights.out_features = out_width_ * blocks_;
    ASSIGN_OR_RETURN(id_, engine.Upload(weights));
    if (engine.copies_weights()) {
      WeightBytes().swap(weight_);
      WeightBytes().swap(bias_);
    }
    return absl::OkStatus();
  }

  // A row of `groups` inputs is `groups` rows of the Linear (then one
  // block only).
  absl::Status Run(const RunContext& context, int64_t rows,
                   Values& values) const override {
    std::vector<float> y = Output(rows);
    const DType out_dtype =
        op->dtype == ValueDType::kModel ? context.model_dtype : DType::kFloat32;
    RETURN_IF_ERROR(context.linear_engine->Forward(
        id_, values[in[0]], rows * groups_, out_dtype, absl::MakeSpan(y)));
    Store(std::move(y), values);
    return absl::OkStatus();
  }

 private:
  const int64_t in_width_;
  const int64_t out_width_;  // per block and group
  const int64_t groups_;
  int64_t blocks_ = 0;
  DType dtype_ = DType::kFloat32;  // of weights and biases
  WeightBytes weight_;             // [L * W, in], block after block
  WeightBytes bias_;               // [L * W], empty for a Linear without
  int id_ = -1;                    // on the engine
};

}  // namespace

absl::StatusOr<OpPlan> PlanLinear(const Op& op, PlanContext& context) {
  ASSIGN_OR_RETURN(const int64_t groups, Groups(op, context));
  const ValueInfo& in = *context.in[0];
  if (in.cols % groups != 0 || (groups > 1 && !op.blocks.empty())) {
    return absl::InternalError(absl::StrCat(context.family.name, ": linear ",
                                            op.out, " of ", groups,
                                            " groups over a row of ", in.cols));
  }
  const int64_t in_width = in.cols / groups;
  int64_t unit = context.width / op.width_div;
  if (!op.width_field.empty()) {
    ASSIGN_OR_RETURN(unit, EvaluateConfig(context.config, op.width_field));
  }
  const int64_t out_width = op.width_d * unit;
  auto linear = std::make_unique<LinearOp>(in_width, out_width, groups);
  OpPlan plan = PlanWith(op, context, nullptr);
  ASSIGN_OR_RETURN(const std::vector<int64_t> indices,
                   StackedBlocks(op, context, &plan.out));
  if (indices.empty()) return plan;  // absent from this model
  for (const int64_t block : indices) {
    const std::string prefix =
        absl::StrReplaceAll(op.weight, {{"{i}", absl::StrCat(block)}});
    ASSIGN_OR_RETURN(
        const DType dtype,
        context.tensors.DTypeFor(op.weight_dtype, prefix + ".weight"));
    ASSIGN_OR_RETURN(
        LoadedTensor weight,
        context.tensors.Load(prefix + ".weight", dtype, {out_width, in_width}));
    LoadedTensor bias;  // empty: the Linear has none
    if (op.has_bias) {
      ASSIGN_OR_RETURN(
          bias, context.tensors.Load(prefix + ".bias", dtype, {out_width}));
    }
    linear->Add(dtype, weight, bias, static_cast<int64_t>(indices.size()));
  }
  plan.out.cols = out_width * linear->blocks() * groups;
  plan.out.scalar = false;
  linear->block_indices = indices;
  plan.planned = std::move(linear);
  return plan;
}

}  // namespace temb::models::ops
