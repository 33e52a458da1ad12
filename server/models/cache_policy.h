// How a call shares the row cache (row_cache.h).  A call's ops fall in
// three groups: scalars (cheap: always computed), row values computed from
// the timestep-like inputs alone (cached: one entry per distinct row of
// those inputs, keyed by their exact bits), and the rest (values of row
// inputs such as the pooled embedding, computed every call).  Only the
// cached values something later or the caller reads, the frontier, are
// kept in an entry.
#ifndef TEMB_MODELS_CACHE_POLICY_H_
#define TEMB_MODELS_CACHE_POLICY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "model_graph.h"
#include "op_unit.h"
#include "temb/models/row_cache.h"

namespace temb::models {

struct CachePlan {
  std::vector<int> scalar_ops;   // run over every row first
  std::vector<int> cached_ops;   // run over the rows the cache misses only
  std::vector<int> other_ops;    // run over every row last
  std::vector<int> frontier;     // slots kept in an entry, in op order
  std::vector<int> key_scalars;  // slots keyed by their bits, by name
};

// The groups of the ops in `needed` (by op index) for a call that reads
// `wanted` (slots).
CachePlan PlanCaching(const ModelGraph& graph, const std::vector<bool>& needed,
                      const std::vector<int>& wanted);

// Fills values[frontier] for `rows` rows, the scalars already computed:
// each distinct key is looked up in `cache` (may be null) and the rows it
// misses are computed alone (the ops are batch-invariant, so these are the
// bits a full batch would give) and inserted.  `model_key` names the
// model's weights and engine.
absl::Status FillCachedRows(const ModelGraph& graph, const CachePlan& plan,
                            const RunContext& context,
                            const std::string& model_key, RowCache* cache,
                            int64_t rows, Values& values);

}  // namespace temb::models

#endif  // TEMB_MODELS_CACHE_POLICY_H_
