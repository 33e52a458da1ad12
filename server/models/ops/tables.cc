// The op kinds that read a checkpoint table as values: a table added to a
// row (Wan's and PixArt's scale_shift_table + temb) and a table row picked
// by an index (nn.Embedding).
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "ops/units.h"
#include "temb/base/status_macros.h"

namespace temb::models::ops {
namespace {

// in[0] + a table of shape table_shape + [D], in[0]'s row repeated along
// the table when the table is wider; one table per block of a stack.
class TableAddOp : public PlannedOp {
 public:
  TableAddOp(int64_t in_width, int64_t table_width)
      : in_width_(in_width), table_width_(table_width) {}

  void Add(std::vector<float> table) { tables_.push_back(std::move(table)); }
  int64_t blocks() const { return static_cast<int64_t>(tables_.size()); }

  absl::Status Run(const RunContext& context, int64_t rows,
                   Values& values) const override {
    const std::vector<float>& in_values = values[in[0]];
    std::vector<float> out_values = Output(rows);
    for (int64_t row = 0; row < rows; ++row) {
      const float* x = in_values.data() + row * in_width_;
      for (int64_t block = 0; block < blocks(); ++block) {
        const std::vector<float>& table = tables_[block];
        float* y = out_values.data() + row * out_cols + block * table_width_;
        for (int64_t j = 0; j < table_width_; ++j) {
          y[j] = Round(context, x[j % in_width_] + table[j]);
        }
      }
    }
    Store(std::move(out_values), values);
    return absl::OkStatus();
  }

 private:
  const int64_t in_width_;
  const int64_t table_width_;
  std::vector<std::vector<float>> tables_;  // one per block
};

// The row of a [rows, D] table that in[0], an index the evaluator checked
// against the rows, picks.
class EmbeddingOp : public PlannedOp {
 public:
  EmbeddingOp(std::vector<float> table, int64_t width)
      : table_(std::move(table)), width_(width) {}

  absl::Status Run(const RunContext& context, int64_t rows,
                   Values& values) const override {
    const std::vector<float>& index = values[in[0]];
    std::vector<float> y = Output(rows);
    for (int64_t row = 0; row < rows; ++row) {
      const float* picked =
          table_.data() + static_cast<int64_t>(index[row]) * width_;
      for (int64_t j = 0; j < width_; ++j) {
        y[row * width_ + j] = Round(context, picked[j]);
      }
    }
    Store(std::move(y), values);
    return absl::OkStatus();
  }

 private:
  const std::vector<float> table_;
  const int64_t width_;
};

}  // namespace

absl::StatusOr<OpPlan> PlanTableAdd(const Op& op, PlanContext& context) {
  const ValueInfo& in = *context.in[0];
  if (in.blocks > 0) {
    return absl::InternalError(
        absl::StrCat(context.family.name, ": table add to a stacked value"));
  }
  std::vector<int64_t> shape = op.table_shape;
  shape.push_back(context.width);
  int64_t table_width = 1;
  for (const int64_t dim : shape) table_width *= dim;
  if (table_width % in.cols != 0) {
    return absl::InternalError(absl::StrCat(
        context.family.name, ": ", op.weight, " holds ", table_width,
        " values, not a multiple of ", op.in[0], "'s ", in.cols));
  }
  auto table_add = std::make_unique<TableAddOp>(in.cols, table_width);
  OpPlan plan = PlanWith(op, context, nullptr);
  ASSIGN_OR_RETURN(const std::vector<int64_t> indices,
                   StackedBlocks(op, context, &plan.out));
  for (const int64_t block : indices) {
    const std::string name =
        absl::StrReplaceAll(op.weight, {{"{i}", absl::StrCat(block)}});
    ASSIGN_OR_RETURN(const DType dtype,
                     context.tensors.DTypeFor(op.weight_dtype, name));
    ASSIGN_OR_RETURN(std::vector<float> table,
                     context.tensors.LoadValues(name, dtype, shape));
    table_add->Add(std::move(table));
  }
  if (table_add->blocks() == 0) return plan;  // absent from this model
  plan.out.cols = table_width * table_add->blocks();
  plan.out.scalar = false;
  table_add->block_indices = indices;
  plan.planned = std::move(table_add);
  return plan;
}

absl::StatusOr<OpPlan> PlanEmbedding(const Op& op, PlanContext& context) {
  const auto index = std::find_if(
      context.family.inputs.begin(), context.family.inputs.end(),
      [&](const InputSpec& spec) { return spec.name == op.in[0]; });
  if (!context.in[0]->scalar || index == context.family.inputs.end() ||
      op.table_shape.size() != 1 || index->index_count != op.table_shape[0]) {
    return absl::InternalError(absl::StrCat(
        context.family.name, ": ", op.out, " is not indexed by an input of ",
        op.table_shape.empty() ? 0 : op.table_shape[0], " indices"));
  }
  ASSIGN_OR_RETURN(const DType dtype,
                   context.tensors.DTypeFor(ValueDType::kModel, op.weight));
  ASSIGN_OR_RETURN(std::vector<float> table,
                   context.tensors.LoadValues(
                       op.weight, dtype, {op.table_shape[0], context.width}));
  OpPlan plan =
      PlanWith(op, context,
               std::make_unique<EmbeddingOp>(std::move(table), context.width));
  plan.out.cols = context.width;
  plan.out.scalar = false;
  return plan;
}

}  // namespace temb::models::ops
