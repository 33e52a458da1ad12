// temb.v1's Condition messages <-> ConditioningService's plain types, and
// the conditioning models in ServerInfo: the native frontend and temb.local
// (client/local) use it.  A target of its own (temb::v1_condition), so that
// v1_convert alone does not link the checkpoint reader.
#ifndef TEMB_V1_CONVERT_CONDITION_CONVERT_H_
#define TEMB_V1_CONVERT_CONDITION_CONVERT_H_

#include <vector>

#include "absl/status/statusor.h"
#include "temb/core/conditioning_service.h"
#include "temb/v1/temb.pb.h"

namespace temb {

// `request` as the core's ConditionRequest; it points into `request` and
// into `storage`, which receives every input's values as float32, and both
// must outlive it.  INVALID_ARGUMENT naming the field ("inputs[1].tensor.
// data", ...) for a request_id over kMaxRequestIdBytes, an input without a
// name, a dtype that is not FP32, FP64,
// FP16 or BF16, data that is not a whole number of elements or does not
// match the shape, or an FP64 value that is not exactly a float32 (temb
// never rounds a caller's input: its exact bits key the row cache).
absl::StatusOr<ConditionRequest> ConditionRequestFromProto(
    const v1::ConditionRequest& request,
    std::vector<std::vector<float>>* storage);

// The answer, its outputs' data moved out of `response`.
v1::ConditionResponse ConditionResponseToProto(ConditionResponse response,
                                               const std::string& request_id);

void ConditioningModelToProto(const ConditioningModelInfo& model,
                              v1::ConditioningModel* out);

// Every model of `service` with its state now, and the row cache's counters.
void AddConditioningToServerInfo(const ConditioningService& service,
                                 v1::ServerInfo* info);

}  // namespace temb

#endif  // TEMB_V1_CONVERT_CONDITION_CONVERT_H_
