// Reading a family's description against one model's config.json: the
// integer expressions that size values (family.h), the flags that switch
// ops, inputs and outputs on, and the blocks a stacked op covers.
#ifndef TEMB_MODELS_CONFIG_EXPRESSION_H_
#define TEMB_MODELS_CONFIG_EXPRESSION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "temb/models/checkpoint.h"
#include "temb/models/family.h"

namespace temb::models {

// The value of a config expression: terms of field names, list entries
// ("block_out_channels[-1]") and integer literals, joined by + - *, and
// min(a, b).  INVALID_ARGUMENT naming the file unless it is in [1, 2^31];
// INTERNAL for a malformed expression (a bug in a description).
absl::StatusOr<int64_t> EvaluateConfig(const ModelConfig& config,
                                       const std::string& text);

// Whether an Op::when-style condition holds ("flag", "!flag",
// "field=JSON"; empty: always), a null flag taking the family's
// FlagDefault when it has one.
absl::StatusOr<bool> ConditionHolds(const FamilyDescription& family,
                                    const ModelConfig& config,
                                    const std::string& when);

// The blocks of `count` that a stacked op's BlockSelect covers, in
// increasing index.
absl::StatusOr<std::vector<int64_t>> SelectBlocks(const ModelConfig& config,
                                                  const Op& op, int64_t count);

}  // namespace temb::models

#endif  // TEMB_MODELS_CONFIG_EXPRESSION_H_
