// The plan step of each op kind (op_unit.h), one per kind; PlanOp
// (ops/op_units.cc) dispatches to them.
#ifndef TEMB_MODELS_OPS_UNITS_H_
#define TEMB_MODELS_OPS_UNITS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "op_unit.h"

namespace temb::models::ops {

// ops/elementwise.cc
absl::StatusOr<OpPlan> PlanCast(const Op& op, PlanContext& context);
absl::StatusOr<OpPlan> PlanDivide(const Op& op, PlanContext& context);
absl::StatusOr<OpPlan> PlanMultiply(const Op& op, PlanContext& context);
absl::StatusOr<OpPlan> PlanSubtractFrom(const Op& op, PlanContext& context);
absl::StatusOr<OpPlan> PlanSilu(const Op& op, PlanContext& context);
absl::StatusOr<OpPlan> PlanAdd(const Op& op, PlanContext& context);
// ops/sinusoid.cc
absl::StatusOr<OpPlan> PlanSinusoid(const Op& op, PlanContext& context);
// ops/linear.cc
absl::StatusOr<OpPlan> PlanLinear(const Op& op, PlanContext& context);
// ops/tables.cc
absl::StatusOr<OpPlan> PlanTableAdd(const Op& op, PlanContext& context);
absl::StatusOr<OpPlan> PlanEmbedding(const Op& op, PlanContext& context);
// ops/rows.cc
absl::StatusOr<OpPlan> PlanConcat(const Op& op, PlanContext& context);
absl::StatusOr<OpPlan> PlanRange(const Op& op, PlanContext& context);
absl::StatusOr<OpPlan> PlanRepeatBeside(const Op& op, PlanContext& context);
// ops/rms_norm.cc
absl::StatusOr<OpPlan> PlanRmsNorm(const Op& op, PlanContext& context);

// Shared by the plan steps: the op's `groups`, from its config expression
// when it names one.
absl::StatusOr<int64_t> Groups(const Op& op, const PlanContext& context);

// The blocks a stacked op (`blocks` set) covers, in increasing index; {0}
// for an unstacked one ("{i}" is unused).  Sets out->blocks unless the
// selection is kLast (an unstacked value).
absl::StatusOr<std::vector<int64_t>> StackedBlocks(const Op& op,
                                                   const PlanContext& context,
                                                   ValueInfo* out);

// An OpPlan whose output starts as in[0]'s shape (op_unit.h) and whose
// planned op is `planned`.
OpPlan PlanWith(const Op& op, const PlanContext& context,
                std::unique_ptr<PlannedOp> planned);

}  // namespace temb::models::ops

#endif  // TEMB_MODELS_OPS_UNITS_H_
