// nn.RMSNorm (eps None) over each of in[0]'s `groups` equal parts, times a
// checkpoint weight, as PyTorch's CPU rms_norm computes it: the float32
// epsilon whatever the dtype, the weight multiplied in float32, one
// rounding to the op's dtype.
#include <cmath>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "ops/units.h"
#include "temb/base/status_macros.h"

namespace temb::models::ops {
namespace {

class RmsNormOp : public PlannedOp {
 public:
  RmsNormOp(std::vector<float> weight, int64_t groups)
      : weight_(std::move(weight)), groups_(groups) {}

  // The squares rounded to float32 and their mean (a float32 sum here
  // summed in double, then rounded), plus float32's epsilon, rsqrt as
  // 1 / sqrt; x * that, times the weight, each product in float32.
  absl::Status Run(const RunContext& context, int64_t rows,
                   Values& values) const override {
    const std::vector<float>& in_values = values[in[0]];
    std::vector<float> out_values = Output(rows);
    const int64_t width = static_cast<int64_t>(weight_.size());
    const float epsilon = std::numeric_limits<float>::epsilon();
    for (int64_t part = 0; part < rows * groups_; ++part) {
      const float* x = in_values.data() + part * width;
      double sum = 0;
      for (int64_t k = 0; k < width; ++k) {
        sum += static_cast<double>(x[k] * x[k]);
      }
      const float mean = static_cast<float>(sum) / static_cast<float>(width);
      const float scale = 1.0f / std::sqrt(mean + epsilon);
      float* y = out_values.data() + part * width;
      for (int64_t k = 0; k < width; ++k) {
        y[k] = Round(context, (x[k] * scale) * weight_[k]);
      }
    }
    Store(std::move(out_values), values);
    return absl::OkStatus();
  }

 private:
  const std::vector<float> weight_;
  const int64_t groups_;
};

}  // namespace

absl::StatusOr<OpPlan> PlanRmsNorm(const Op& op, PlanContext& context) {
  ASSIGN_OR_RETURN(const int64_t groups, Groups(op, context));
  if (context.in[0]->cols % groups != 0) {
    return absl::InternalError(absl::StrCat(context.family.name, ": ", op.out,
                                            ": ", op.in[0], " is not ", groups,
                                            " equal parts"));
  }
  const int64_t width = context.in[0]->cols / groups;
  ASSIGN_OR_RETURN(const DType dtype,
                   context.tensors.DTypeFor(ValueDType::kModel, op.weight));
  ASSIGN_OR_RETURN(std::vector<float> weight,
                   context.tensors.LoadValues(op.weight, dtype, {width}));
  return PlanWith(op, context,
                  std::make_unique<RmsNormOp>(std::move(weight), groups));
}

}  // namespace temb::models::ops
