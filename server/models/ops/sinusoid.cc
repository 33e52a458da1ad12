// diffusers' get_timestep_embedding of in[0], in float32, by the CPU
// sinusoid kernel.  A row value's elements are embedded each, side by
// side: diffusers' sinusoid of x.flatten() reshaped to [N, -1] (SDXL's six
// time ids).
#include <cmath>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "config_expression.h"
#include "ops/units.h"
#include "temb/base/status_macros.h"
#include "temb/kernels/embedding_spec.h"

namespace temb::models::ops {
namespace {

class SinusoidOp : public PlannedOp {
 public:
  explicit SinusoidOp(const SinusoidParams& params) {
    spec_.dim = params.dim;
    spec_.flip_sin_to_cos = params.flip_sin_to_cos;
    spec_.downscale_freq_shift = params.downscale_freq_shift;
    spec_.scale = params.scale;
    spec_.max_period = params.max_period;
    spec_.dtype = DType::kFloat32;
  }

  absl::Status Run(const RunContext& context, int64_t rows,
                   Values& values) const override {
    const std::vector<float>& x = values[in[0]];
    std::vector<float> y = Output(rows);
    RETURN_IF_ERROR(ValidateRequest(spec_, x, Limits()));
    RETURN_IF_ERROR(context.sinusoid_backend->Compute(
        spec_, x,
        absl::MakeSpan(reinterpret_cast<uint8_t*>(y.data()),
                       y.size() * sizeof(float))));
    Store(std::move(y), values);
    return absl::OkStatus();
  }

 private:
  EmbeddingSpec spec_;
};

}  // namespace

absl::StatusOr<OpPlan> PlanSinusoid(const Op& op, PlanContext& context) {
  const ValueInfo& in = *context.in[0];
  if (in.blocks > 0) {
    return absl::InternalError(
        absl::StrCat(context.family.name, ": sinusoid of a stacked value"));
  }
  SinusoidParams params = op.sinusoid;
  if (params.dim_is_width) {
    params.dim = static_cast<int>(context.width);
  } else if (!params.dim_field.empty()) {
    ASSIGN_OR_RETURN(const int64_t dim,
                     EvaluateConfig(context.config, params.dim_field));
    params.dim = static_cast<int>(dim);
  }
  if (!params.flip_field.empty()) {
    ASSIGN_OR_RETURN(params.flip_sin_to_cos,
                     context.config.Bool(params.flip_field, true));
  }
  if (!params.shift_field.empty()) {
    ASSIGN_OR_RETURN(params.downscale_freq_shift,
                     context.config.Number(params.shift_field, 0));
  }
  if (!params.max_period_field.empty()) {
    ASSIGN_OR_RETURN(
        params.max_period,
        context.config.Number(params.max_period_field, params.max_period));
    if (!std::isfinite(params.max_period) || params.max_period <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          context.config.file(), ": field ", params.max_period_field,
          ": must be a positive number (a sinusoid's max_period), got ",
          params.max_period));
    }
  }
  OpPlan plan = PlanWith(op, context, std::make_unique<SinusoidOp>(params));
  plan.out.cols = params.dim * (in.scalar ? 1 : in.cols);
  plan.out.scalar = false;
  return plan;
}

}  // namespace temb::models::ops
