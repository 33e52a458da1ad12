// The op kinds that lay values out side by side in a row: a concatenation,
// constant index rows, and a row repeated beside each group of another.
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "config_expression.h"
#include "ops/units.h"
#include "temb/base/status_macros.h"

namespace temb::models::ops {
namespace {

// in[0], in[1], ... side by side in each row, every element rounded to the
// op's dtype (a no-op for inputs already there); a scalar is one column.
class ConcatOp : public PlannedOp {
 public:
  absl::Status Run(const RunContext& context, int64_t rows,
                   Values& values) const override {
    std::vector<float> y = Output(rows);
    int64_t offset = 0;
    for (size_t i = 0; i < in.size(); ++i) {
      const int64_t cols = in_cols[i];
      const std::vector<float>& x = values[in[i]];
      for (int64_t row = 0; row < rows; ++row) {
        for (int64_t col = 0; col < cols; ++col) {
          y[row * out_cols + offset + col] =
              Round(context, x[row * cols + col]);
        }
      }
      offset += cols;
    }
    Store(std::move(y), values);
    return absl::OkStatus();
  }
};

// Rows whose column k holds k * constant; in[0] gives the row count only.
class RangeOp : public PlannedOp {
 public:
  explicit RangeOp(float constant) : constant_(constant) {}

  absl::Status Run(const RunContext& context, int64_t rows,
                   Values& values) const override {
    std::vector<float> y = Output(rows);
    for (int64_t row = 0; row < rows; ++row) {
      for (int64_t k = 0; k < out_cols; ++k) {
        y[row * out_cols + k] =
            Round(context, static_cast<float>(k) * constant_);
      }
    }
    Store(std::move(y), values);
    return absl::OkStatus();
  }

 private:
  const float constant_;
};

// Per row, per group: in[0]'s row, then the group's part of in[1].
class RepeatBesideOp : public PlannedOp {
 public:
  explicit RepeatBesideOp(int64_t groups) : groups_(groups) {}

  absl::Status Run(const RunContext& context, int64_t rows,
                   Values& values) const override {
    const std::vector<float>& first_values = values[in[0]];
    const std::vector<float>& parts = values[in[1]];
    const int64_t first = in_cols[0];
    const int64_t part = in_cols[1] / groups_;
    std::vector<float> y = Output(rows);
    float* to = y.data();
    for (int64_t row = 0; row < rows; ++row) {
      for (int64_t g = 0; g < groups_; ++g) {
        for (int64_t k = 0; k < first; ++k) {
          *to++ = Round(context, first_values[row * first + k]);
        }
        const float* from = parts.data() + (row * groups_ + g) * part;
        for (int64_t k = 0; k < part; ++k) *to++ = Round(context, from[k]);
      }
    }
    Store(std::move(y), values);
    return absl::OkStatus();
  }

 private:
  const int64_t groups_;
};

}  // namespace

absl::StatusOr<OpPlan> PlanConcat(const Op& op, PlanContext& context) {
  OpPlan plan = PlanWith(op, context, std::make_unique<ConcatOp>());
  plan.out.cols = 0;  // a scalar is one column (ValueInfo::cols is 1)
  for (const ValueInfo* value : context.in) {
    if (value->blocks > 0) {
      return absl::InternalError(
          absl::StrCat(context.family.name, ": concat of a stacked value"));
    }
    plan.out.cols += value->cols;
  }
  plan.out.scalar = false;
  return plan;
}

absl::StatusOr<OpPlan> PlanRange(const Op& op, PlanContext& context) {
  OpPlan plan = PlanWith(
      op, context, std::make_unique<RangeOp>(static_cast<float>(op.constant)));
  ASSIGN_OR_RETURN(plan.out.cols,
                   EvaluateConfig(context.config, op.width_field));
  plan.out.scalar = false;
  return plan;
}

absl::StatusOr<OpPlan> PlanRepeatBeside(const Op& op, PlanContext& context) {
  ASSIGN_OR_RETURN(const int64_t groups, Groups(op, context));
  if (context.in.size() != 2 || context.in[1]->blocks > 0 ||
      context.in[1]->cols % groups != 0) {
    return absl::InternalError(absl::StrCat(context.family.name, ": ", op.out,
                                            ": ", op.in.back(), " is not ",
                                            groups, " equal parts"));
  }
  OpPlan plan = PlanWith(op, context, std::make_unique<RepeatBesideOp>(groups));
  plan.out.cols = groups * context.in[0]->cols + context.in[1]->cols;
  plan.out.scalar = false;
  return plan;
}

}  // namespace temb::models::ops
