// The element-wise op kinds: each output element is a function of the
// same element of the inputs, computed in float32 and rounded once to the
// op's dtype, as PyTorch computes it on the CPU (the library is built
// without floating-point contraction).
#include <cmath>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "config_expression.h"
#include "ops/units.h"
#include "temb/base/status_macros.h"

namespace temb::models::ops {
namespace {

// in[0] rounded to the op's dtype.
class CastOp : public PlannedOp {
 public:
  absl::Status Run(const RunContext& context, int64_t rows,
                   Values& values) const override {
    const std::vector<float>& x = values[in[0]];
    std::vector<float> y = Output(rows);
    for (size_t i = 0; i < y.size(); ++i) y[i] = Round(context, x[i]);
    Store(std::move(y), values);
    return absl::OkStatus();
  }
};

// in[0] and a constant: the constant is a Python number, which PyTorch
// rounds to float32 before it meets a float32 tensor.
float Divided(float x, float constant) { return x / constant; }
float Multiplied(float x, float constant) { return x * constant; }
float SubtractedFrom(float x, float constant) { return constant - x; }

template <float (*kApply)(float, float)>
class ConstantOp : public PlannedOp {
 public:
  explicit ConstantOp(float constant) : constant_(constant) {}

  absl::Status Run(const RunContext& context, int64_t rows,
                   Values& values) const override {
    const std::vector<float>& x = values[in[0]];
    std::vector<float> y = Output(rows);
    for (size_t i = 0; i < y.size(); ++i) {
      y[i] = Round(context, kApply(x[i], constant_));
    }
    Store(std::move(y), values);
    return absl::OkStatus();
  }

 private:
  const float constant_;
};

// The constant, or the config.json number `constant_field` (Sana's
// timestep_scale) with the constant as its default.
template <float (*kApply)(float, float)>
absl::StatusOr<OpPlan> PlanConstant(const Op& op, PlanContext& context) {
  double constant = op.constant;
  if (!op.constant_field.empty()) {
    ASSIGN_OR_RETURN(constant,
                     context.config.Number(op.constant_field, op.constant));
  }
  return PlanWith(
      op, context,
      std::make_unique<ConstantOp<kApply>>(static_cast<float>(constant)));
}

// in[0] * sigmoid(in[0]), as in[0] / (1 + exp(-in[0])).
class SiluOp : public PlannedOp {
 public:
  absl::Status Run(const RunContext& context, int64_t rows,
                   Values& values) const override {
    const std::vector<float>& x = values[in[0]];
    std::vector<float> y = Output(rows);
    for (size_t i = 0; i < y.size(); ++i) {
      y[i] = Round(context, x[i] / (1.0f + std::exp(-x[i])));
    }
    Store(std::move(y), values);
    return absl::OkStatus();
  }
};

// in[0] + in[1], of one width.
class AddOp : public PlannedOp {
 public:
  absl::Status Run(const RunContext& context, int64_t rows,
                   Values& values) const override {
    const std::vector<float>& a = values[in[0]];
    const std::vector<float>& b = values[in[1]];
    std::vector<float> y = Output(rows);
    for (size_t i = 0; i < y.size(); ++i) y[i] = Round(context, a[i] + b[i]);
    Store(std::move(y), values);
    return absl::OkStatus();
  }
};

}  // namespace

absl::StatusOr<OpPlan> PlanCast(const Op& op, PlanContext& context) {
  return PlanWith(op, context, std::make_unique<CastOp>());
}

absl::StatusOr<OpPlan> PlanDivide(const Op& op, PlanContext& context) {
  return PlanConstant<Divided>(op, context);
}

absl::StatusOr<OpPlan> PlanMultiply(const Op& op, PlanContext& context) {
  return PlanConstant<Multiplied>(op, context);
}

absl::StatusOr<OpPlan> PlanSubtractFrom(const Op& op, PlanContext& context) {
  return PlanConstant<SubtractedFrom>(op, context);
}

absl::StatusOr<OpPlan> PlanSilu(const Op& op, PlanContext& context) {
  return PlanWith(op, context, std::make_unique<SiluOp>());
}

absl::StatusOr<OpPlan> PlanAdd(const Op& op, PlanContext& context) {
  if (context.in.size() != 2 || context.in[1]->cols != context.in[0]->cols) {
    return absl::InternalError(
        absl::StrCat(context.family.name, ": add of unequal widths"));
  }
  return PlanWith(op, context, std::make_unique<AddOp>());
}

}  // namespace temb::models::ops
