// An op kind of a family's description (family.h) as a unit of its own:
// a plan step, run once when a model loads, that resolves the op against
// the model's config.json and checkpoint (its widths, its tensors, its
// values' slots), and a run step that computes it for N rows.  The loader
// and the evaluator know ops only through this interface; ops/op_units.cc
// maps each OpKind to its plan step.
#ifndef TEMB_MODELS_OP_UNIT_H_
#define TEMB_MODELS_OP_UNIT_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "temb/kernels/backend.h"
#include "temb/kernels/dtype.h"
#include "temb/kernels/linear.h"
#include "temb/kernels/linear_engine.h"
#include "temb/models/checkpoint.h"
#include "temb/models/family.h"
#include "tensor_reader.h"

namespace temb::models {

// A value of the description as one model has it: its width per row and
// the dtype it is rounded to.
struct ValueInfo {
  int64_t cols = 1;    // floats per row
  int64_t blocks = 0;  // > 0: a stacked value [L = blocks, cols / blocks]
  bool scalar = true;  // [N]
  ValueDType dtype = ValueDType::kFloat32;
  uint32_t depends = 0;  // a bit per family input it is computed from
  int producer = -1;     // the op computing it; -1 for an input
};

// A call's values by slot: [rows * cols] floats each, holding values of
// the dtype each is rounded to (empty: not computed in this call).
using Values = std::vector<std::vector<float>>;

// What a run step may use besides its values.
struct RunContext {
  DType model_dtype = DType::kFloat32;
  Backend* sinusoid_backend = nullptr;    // the CPU sinusoid
  LinearEngine* linear_engine = nullptr;  // where the Linears were uploaded
};

// An op resolved against one model.
class PlannedOp {
 public:
  virtual ~PlannedOp() = default;

  // Computes values[out] ([rows * out_cols]) from values[in[...]].
  virtual absl::Status Run(const RunContext& context, int64_t rows,
                           Values& values) const = 0;
  // Hands the op's Linear parameters to `engine` (Linears only), releasing
  // the host copy when the engine made its own.
  virtual absl::Status Upload(LinearEngine& engine) {
    (void)engine;
    return absl::OkStatus();
  }

  const Op* op = nullptr;
  std::vector<int> in;           // slots of op->in
  int out = -1;                  // slot of op->out
  std::vector<int64_t> in_cols;  // the inputs' widths
  int64_t out_cols = 0;
  // A Linear's or table add's blocks, each the i of op->weight's "{i}", in
  // the order of its result's rows ({0} when it is not stacked).
  std::vector<int64_t> block_indices;

 protected:
  // `value` rounded to where the op's result goes.
  float Round(const RunContext& context, float value) const {
    return op->dtype == ValueDType::kModel
               ? RoundToDType(value, context.model_dtype)
               : value;
  }
  // The op's result for `rows` rows, to fill and hand to Store.
  std::vector<float> Output(int64_t rows) const {
    return std::vector<float>(static_cast<size_t>(rows * out_cols));
  }
  void Store(std::vector<float> result, Values& values) const {
    values[out] = std::move(result);
  }
};

// What a plan step sees of the model.
struct PlanContext {
  const FamilyDescription& family;
  const ModelConfig& config;
  int64_t width = 0;  // D
  TensorReader& tensors;
  std::vector<const ValueInfo*> in;  // op.in's values, in order
};

// A plan step's result: the op's output value, and the planned op (null
// when the op covers no block of this model: SD3.0's dual-attention
// modulation; the value is then absent).
struct OpPlan {
  ValueInfo out;
  std::unique_ptr<PlannedOp> planned;
};

// The plan step of op.kind.  `out` of the result comes with dtype, depends,
// cols and scalar already set from the inputs (in[0]'s shape); a unit
// changes what its kind changes.  INVALID_ARGUMENT naming the file for a
// checkpoint that does not fit; INTERNAL for a description that cannot be
// planned (a bug in the family's file).
absl::StatusOr<OpPlan> PlanOp(const Op& op, PlanContext& context);

}  // namespace temb::models

#endif  // TEMB_MODELS_OP_UNIT_H_
