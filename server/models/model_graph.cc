#include "model_graph.h"

namespace temb::models {

std::vector<bool> ModelGraph::OpsFor(const std::vector<int>& wanted,
                                     const std::vector<bool>& provided) const {
  std::vector<bool> needed(ops.size(), false);
  std::vector<int> stack = wanted;
  while (!stack.empty()) {
    const int slot = stack.back();
    stack.pop_back();
    if (!provided.empty() && provided[slot]) continue;
    const int producer = values[slot].producer;
    if (producer < 0 || needed[producer]) continue;
    needed[producer] = true;
    for (const int in : ops[producer]->in) stack.push_back(in);
  }
  return needed;
}

}  // namespace temb::models
