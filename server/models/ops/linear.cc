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

class LinearOp : public PlannedOp {
 public:
  LinearOp(int64_t in_width, int64_t out_width, int64_t groups)
      : in_width_(in_width), out_width_(out_width), groups_(groups) {}

  // Block `block`'s parameters, in block order.
  void Add(DType dtype, LoadedTensor weight, LoadedTensor bias) {
    dtype_ = dtype;
    weights_.push_back(std::move(weight));
    biases_.push_back(std::move(bias));
  }
  int64_t blocks() const { return static_cast<int64_t>(weights_.size()); }

  absl::Status Upload(LinearEngine& engine) override {
    for (int64_t block = 0; block < blocks(); ++block) {
      LinearWeights weights;
      weights.weight = weights_[block].data;
      weights.bias = biases_[block].data;
      weights.dtype = dtype_;
      weights.in_features = in_width_;
      weights.out_features = out_width_;
      ASSIGN_OR_RETURN(const int id, engine.Upload(weights));
      engine_ids_.push_back(id);
      // The device holds them now.
      WeightBytes().swap(weights_[block].data);
      WeightBytes().swap(biases_[block].data);
    }
    return absl::OkStatus();
  }

  absl::Status Run(const RunContext& context, int64_t rows,
                   Values& values) const override {
    const std::vector<float>& x = values[in[0]];
    std::vector<float> y = Output(rows);
    const DType out_dtype = op->dtype == ValueDType::kModel
                                ? context.model_dtype
                                : DType::kFloat32;
    // A row of `groups` inputs is `groups` rows of the Linear.
    const int64_t row_width = out_width_ * groups_;
    std::vector<float> block_out(static_cast<size_t>(rows * row_width));
    for (int64_t block = 0; block < blocks(); ++block) {
      if (context.linear_engine != nullptr) {
        RETURN_IF_ERROR(context.linear_engine->Forward(
            engine_ids_[block], x, rows * groups_, out_dtype,
            absl::MakeSpan(block_out)));
      } else {
        LinearParams params;
        params.weight = weights_[block].data;
        params.bias = biases_[block].data;
        params.dtype = dtype_;
        params.in_features = in_width_;
        params.out_features = out_width_;
        RETURN_IF_ERROR(LinearForward(params, x, rows * groups_, out_dtype,
                                      context.threads,
                                      absl::MakeSpan(block_out)));
      }
      // [N, W] of block `block` into [N, L, W].
      for (int64_t row = 0; row < rows; ++row) {
        std::copy_n(block_out.data() + row * row_width, row_width,
                    y.data() + row * out_cols + block * row_width);
      }
    }
    Store(std::move(y), values);
    return absl::OkStatus();
  }

 private:
  const int64_t in_width_;
  const int64_t out_width_;  // per block and group
  const int64_t groups_;
  DType dtype_ = DType::kFloat32;  // of weights and biases
  std::vector<LoadedTensor> weights_;  // one per block
  std::vector<LoadedTensor> biases_;   // empty data for a Linear without
  std::vector<int> engine_ids_;        // on a LinearEngine: one per block
};

}  // namespace

absl::StatusOr<OpPlan> PlanLinear(const Op& op, PlanContext& context) {
  ASSIGN_OR_RETURN(const int64_t groups, Groups(op, context));
  const ValueInfo& in = *context.in[0];
  if (in.cols % groups != 0 || (groups > 1 && !op.blocks.empty())) {
    return absl::InternalError(
        absl::StrCat(context.family.name, ": linear ", op.out, " of ", groups,
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
    ASSIGN_OR_RETURN(const DType dtype, context.tensors.DTypeFor(
                                            op.weight_dtype, prefix + ".weight"));
    ASSIGN_OR_RETURN(LoadedTensor weight,
                     context.tensors.Load(prefix + ".weight", dtype,
                                          {out_width, in_width}));
    LoadedTensor bias;  // empty: the Linear has none
    if (op.has_bias) {
      ASSIGN_OR_RETURN(bias, context.tensors.Load(prefix + ".bias", dtype,
                                                  {out_width}));
    }
    linear->Add(dtype, std::move(weight), std::move(bias));
  }
  plan.out.cols = out_width * linear->blocks() * groups;
  plan.out.scalar = false;
  plan.planned = std::move(linear);
  return plan;
}

}  // namespace temb::models::ops
