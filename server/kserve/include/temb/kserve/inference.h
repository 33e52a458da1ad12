// The one KServe inference path of both protocols: the gRPC service and the
// REST handler parse their messages into a ModelInferRequest and call
// RunInference, shared memory included.
#ifndef TEMB_KSERVE_INFERENCE_H_
#define TEMB_KSERVE_INFERENCE_H_

#include "absl/status/status.h"
#include "inference/grpc_service.pb.h"
#include "temb/core/admission.h"
#include "temb/core/embed_service.h"
#include "temb/kserve/shared_memory.h"

namespace temb::kserve {

// Infer (kserve_convert.h) with the request's tensors in system shared
// memory read in first and its outputs written there after (shared_memory.h);
// `shared_memory` null: requests that name a region are INVALID_ARGUMENT.
// `output` as in Infer, for requests without shared memory.
absl::Status RunInference(const EmbedService& core,
                          const SharedMemoryRegistry* shared_memory,
                          const inference::ModelInferRequest& request,
                          inference::ModelInferResponse* response,
                          AdmissionTicket* ticket,
                          OutputAllocator* output = nullptr);

// Timesteps a response answers: the rows of every output (all its extents
// but the last), for the request logs and statistics.
int64_t TimestepsAnswered(const inference::ModelInferResponse& response);

}  // namespace temb::kserve

#endif  // TEMB_KSERVE_INFERENCE_H_
