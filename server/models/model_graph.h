// A family's description resolved against one model at load: every value
// it computes has a slot, every op is planned (op_unit.h), and the inputs
// and outputs this model has are known.  Built by the loader, read by the
// evaluator and the cache policy; never changed after load.
#ifndef TEMB_MODELS_MODEL_GRAPH_H_
#define TEMB_MODELS_MODEL_GRAPH_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "op_unit.h"
#include "temb/models/family.h"

namespace temb::models {

struct ModelGraph {
  // Each value by slot: its name in the description and its shape.
  std::vector<std::string> names;
  std::vector<ValueInfo> values;
  absl::flat_hash_map<std::string, int> slots;

  // The family's inputs this model takes, and their slots (for one that
  // stands for a computed value, that value's slot).
  std::vector<InputSpec> inputs;
  std::vector<int> input_slots;
  // Inputs given as rows ([N, W], such as the pooled embedding): a bit per
  // family input, as ValueInfo::depends counts them.
  uint32_t row_inputs = 0;

  // In the description's order: an op reads only earlier ops' values.
  std::vector<std::unique_ptr<PlannedOp>> ops;

  // The family's outputs this model has (not those over an empty block
  // selection), with their chunks resolved, and their values' slots.
  std::vector<OutputSpec> outputs;
  std::vector<int> output_slots;
  // The family's folded modules this model has.
  std::vector<FoldedModule> folded;

  // The ops (by index) that computing the slots `wanted` runs, where the
  // slots marked in `provided` (by slot; may be empty) are given, not
  // computed.
  std::vector<bool> OpsFor(const std::vector<int>& wanted,
                           const std::vector<bool>& provided) const;

  // The slot of `name`, or -1.
  int SlotOf(const std::string& name) const {
    const auto found = slots.find(name);
    return found == slots.end() ? -1 : found->second;
  }
  // The dtype a value is rounded to, in the model's `dtype`.
  static DType DTypeOf(const ValueInfo& value, DType dtype) {
    return value.dtype == ValueDType::kModel ? dtype : DType::kFloat32;
  }
};

}  // namespace temb::models

#endif  // TEMB_MODELS_MODEL_GRAPH_H_
