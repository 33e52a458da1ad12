#include "cache_policy.h"

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "temb/base/status_macros.h"
#include "value_codec.h"

namespace temb::models {
namespace {

bool TimestepOnly(const ModelGraph& graph, int slot) {
  const ValueInfo& value = graph.values[slot];
  return !value.scalar && (value.depends & graph.row_inputs) == 0 &&
         value.depends != 0;
}

// The key of each row: the model, the cached values' names and the exact
// bits of the scalars the cached values are computed from.
std::vector<std::string> RowKeys(const ModelGraph& graph, const CachePlan& plan,
                                 const std::string& model_key, int64_t rows,
                                 const Values& values) {
  std::vector<std::string> names;
  for (const int slot : plan.frontier) names.push_back(graph.names[slot]);
  const std::string prefix =
      absl::StrCat(model_key, "|", absl::StrJoin(names, ","), "|");
  std::vector<std::string> keys(static_cast<size_t>(rows), prefix);
  for (int64_t row = 0; row < rows; ++row) {
    for (const int slot : plan.key_scalars) {
      keys[row].append(reinterpret_cast<const char*>(&values[slot][row]), 4);
    }
  }
  return keys;
}

DType DTypeOfSlot(const ModelGraph& graph, int slot, DType model_dtype) {
  return ModelGraph::DTypeOf(graph.values[slot], model_dtype);
}

// Computes the frontier for `rows_to_compute` alone and encodes each row
// as an entry.
absl::StatusOr<std::vector<std::shared_ptr<const std::string>>> ComputeRows(
    const ModelGraph& graph, const CachePlan& plan, const RunContext& context,
    const std::vector<int64_t>& rows_to_compute, const Values& values) {
  const int64_t m = static_cast<int64_t>(rows_to_compute.size());
  Values sub(values.size());
  for (const int slot : plan.key_scalars) {
    for (const int64_t row : rows_to_compute) {
      sub[slot].push_back(values[slot][row]);
    }
  }
  for (const int op : plan.cached_ops) {
    RETURN_IF_ERROR(graph.ops[op]->Run(context, m, sub));
  }
  std::vector<std::shared_ptr<const std::string>> entries;
  for (int64_t j = 0; j < m; ++j) {
    auto bytes = std::make_shared<std::string>();
    for (const int slot : plan.frontier) {
      const int64_t cols = graph.values[slot].cols;
      AppendEncoded(sub[slot].data() + j * cols, cols,
                    DTypeOfSlot(graph, slot, context.model_dtype), bytes.get());
    }
    entries.push_back(std::move(bytes));
  }
  return entries;
}

}  // namespace

CachePlan PlanCaching(const ModelGraph& graph, const std::vector<bool>& needed,
                      const std::vector<int>& wanted) {
  CachePlan plan;
  std::set<std::pair<std::string, int>> key_scalars;  // by name
  for (size_t i = 0; i < graph.ops.size(); ++i) {
    if (!needed[i]) continue;
    const PlannedOp& op = *graph.ops[i];
    if (graph.values[op.out].scalar) {
      plan.scalar_ops.push_back(static_cast<int>(i));
      continue;
    }
    if (!TimestepOnly(graph, op.out)) {
      plan.other_ops.push_back(static_cast<int>(i));
      continue;
    }
    plan.cached_ops.push_back(static_cast<int>(i));
    for (const int in : op.in) {
      if (graph.values[in].scalar) key_scalars.insert({graph.names[in], in});
    }
    bool read_later =
        std::find(wanted.begin(), wanted.end(), op.out) != wanted.end();
    for (size_t j = i + 1; j < graph.ops.size() && !read_later; ++j) {
      const PlannedOp& later = *graph.ops[j];
      read_later =
          needed[j] && !TimestepOnly(graph, later.out) &&
          std::find(later.in.begin(), later.in.end(), op.out) != later.in.end();
    }
    if (read_later) plan.frontier.push_back(op.out);
  }
  for (const auto& named : key_scalars) {
    plan.key_scalars.push_back(named.second);
  }
  return plan;
}

absl::Status FillCachedRows(const ModelGraph& graph, const CachePlan& plan,
                            const RunContext& context,
                            const std::string& model_key, RowCache* cache,
                            int64_t rows, Values& values) {
  // With nothing cached (only scalars, or only values of the row inputs
  // asked for) there are no entries.
  if (plan.frontier.empty()) return absl::OkStatus();
  const std::vector<std::string> keys =
      RowKeys(graph, plan, model_key, rows, values);
  absl::flat_hash_map<std::string, std::shared_ptr<const std::string>> found;
  std::vector<int64_t> to_compute;  // one row per distinct missing key
  for (int64_t row = 0; row < rows; ++row) {
    if (found.contains(keys[row])) continue;
    std::shared_ptr<const std::string> hit =
        cache != nullptr ? cache->Find(keys[row]) : nullptr;
    if (hit == nullptr) to_compute.push_back(row);
    found[keys[row]] = std::move(hit);
  }
  if (!to_compute.empty()) {
    ASSIGN_OR_RETURN(auto entries,
                     ComputeRows(graph, plan, context, to_compute, values));
    for (size_t j = 0; j < to_compute.size(); ++j) {
      const std::string& key = keys[to_compute[j]];
      if (cache != nullptr) cache->Insert(key, entries[j]);
      found[key] = std::move(entries[j]);
    }
  }
  for (const int slot : plan.frontier) {
    values[slot].resize(static_cast<size_t>(rows * graph.values[slot].cols));
  }
  for (int64_t row = 0; row < rows; ++row) {
    const std::string& bytes = *found.at(keys[row]);
    size_t offset = 0;
    for (const int slot : plan.frontier) {
      const int64_t cols = graph.values[slot].cols;
      const DType dtype = DTypeOfSlot(graph, slot, context.model_dtype);
      DecodeInto(bytes.data() + offset, cols, dtype,
                 values[slot].data() + row * cols);
      offset += static_cast<size_t>(cols) * DTypeSize(dtype);
    }
  }
  return absl::OkStatus();
}

}  // namespace temb::models
