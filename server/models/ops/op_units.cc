// The one table from op kind to plan step.
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "config_expression.h"
#include "ops/units.h"
#include "temb/base/status_macros.h"

namespace temb::models {
namespace ops {

absl::StatusOr<int64_t> Groups(const Op& op, const PlanContext& context) {
  if (op.groups_field.empty()) return op.groups;
  return EvaluateConfig(context.config, op.groups_field);
}

OpPlan PlanWith(const Op& op, const PlanContext& context,
                std::unique_ptr<PlannedOp> planned) {
  OpPlan plan;
  plan.out.dtype = op.dtype;
  for (const ValueInfo* value : context.in) plan.out.depends |= value->depends;
  plan.out.cols = context.in[0]->cols;
  plan.out.scalar = context.in[0]->scalar;
  plan.planned = std::move(planned);
  return plan;
}

absl::StatusOr<std::vector<int64_t>> StackedBlocks(const Op& op,
                                                   const PlanContext& context,
                                                   ValueInfo* out) {
  if (op.blocks.empty()) return std::vector<int64_t>{0};
  ASSIGN_OR_RETURN(const int64_t count,
                   EvaluateConfig(context.config, op.blocks));
  // Each block reads a tensor of its own: a count above the checkpoint's
  // tensors is refused before anything is sized by it.
  if (count > context.tensors.tensor_count()) {
    return absl::InvalidArgumentError(
        absl::StrCat(context.config.file(), ": ", op.blocks, " is ", count,
                     ", more blocks than the checkpoint has tensors (",
                     context.tensors.tensor_count(), ")"));
  }
  ASSIGN_OR_RETURN(std::vector<int64_t> indices,
                   SelectBlocks(context.config, op, count));
  if (op.select != BlockSelect::kLast) {
    out->blocks = static_cast<int64_t>(indices.size());
  }
  return indices;
}

}  // namespace ops

absl::StatusOr<OpPlan> PlanOp(const Op& op, PlanContext& context) {
  using Step = absl::StatusOr<OpPlan> (*)(const Op&, PlanContext&);
  Step step = nullptr;
  switch (op.kind) {
    case OpKind::kCast:
      step = ops::PlanCast;
      break;
    case OpKind::kDivide:
      step = ops::PlanDivide;
      break;
    case OpKind::kMultiply:
      step = ops::PlanMultiply;
      break;
    case OpKind::kSubtractFrom:
      step = ops::PlanSubtractFrom;
      break;
    case OpKind::kSinusoid:
      step = ops::PlanSinusoid;
      break;
    case OpKind::kLinear:
      step = ops::PlanLinear;
      break;
    case OpKind::kSilu:
      step = ops::PlanSilu;
      break;
    case OpKind::kAdd:
      step = ops::PlanAdd;
      break;
    case OpKind::kTableAdd:
      step = ops::PlanTableAdd;
      break;
    case OpKind::kEmbedding:
      step = ops::PlanEmbedding;
      break;
    case OpKind::kConcat:
      step = ops::PlanConcat;
      break;
    case OpKind::kRange:
      step = ops::PlanRange;
      break;
    case OpKind::kRepeatBeside:
      step = ops::PlanRepeatBeside;
      break;
    case OpKind::kRmsNorm:
      step = ops::PlanRmsNorm;
      break;
  }
  if (step == nullptr || context.in.empty() ||
      context.in.size() != op.in.size()) {
    return absl::InternalError(absl::StrCat(
        context.family.name, ": op ", op.out, " has no inputs or no kind"));
  }
  return step(op, context);
}

}  // namespace temb::models
