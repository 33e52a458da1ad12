// The one KServe inference path of both protocols: the gRPC service and the
// REST handler parse their messages into a ModelInferRequest and call
// RunInference, shared memory included.  The models are the presets
// (embedding models, kserve_convert.h) and the conditioning models
// (conditioning_convert.h); the functions below pick the kind by name.
#ifndef TEMB_KSERVE_INFERENCE_H_
#define TEMB_KSERVE_INFERENCE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "inference/grpc_service.pb.h"
#include "inference/model_config.pb.h"
#include "temb/core/admission.h"
#include "temb/core/conditioning_service.h"
#include "temb/core/embed_service.h"
#include "temb/kserve/shared_memory.h"

namespace temb::kserve {

// What a KServe frontend serves: the embedding core's presets and, when
// `conditioning` is set, its models.  A name is one model: a model folder
// named like a preset takes the name (the operator put it there), and the
// preset stays available to the native Embed API.
struct ServedModels {
  const EmbedService& core;
  const ConditioningService* conditioning = nullptr;

  bool IsConditioning(absl::string_view name) const {
    return conditioning != nullptr && conditioning->has_model(name);
  }
  // Every model's name: the presets a folder does not take, then the
  // conditioning models.
  std::vector<std::string> Names() const;
  // Ready: a known model at `version` that can answer now (a conditioning
  // model once loaded).  Unknown models are simply not ready.
  bool Ready(absl::string_view name, absl::string_view version) const;
  // Whether the conditioning models' repository is ready: every model
  // loaded, or settled with --serve_ready_models
  // (ConditioningService::RepositoryReady).
  bool RepositoryReady() const;
  // NOT_FOUND for an unknown model or version; FAILED_PRECONDITION for a
  // conditioning model that is loading or failed.
  absl::Status FillMetadata(absl::string_view name, absl::string_view version,
                            inference::ModelMetadataResponse* response) const;
  absl::Status FillConfig(absl::string_view name, absl::string_view version,
                          inference::ModelConfig* config) const;
};

// Infer (kserve_convert.h) or InferConditioning (conditioning_convert.h),
// with the request's tensors in system shared memory read in first and its
// outputs written there after (shared_memory.h); `shared_memory` null:
// requests that name a region are INVALID_ARGUMENT.  `output` as in Infer,
// for embedding requests without shared memory.
absl::Status RunInference(const ServedModels& models,
                          const SharedMemoryRegistry* shared_memory,
                          const inference::ModelInferRequest& request,
                          inference::ModelInferResponse* response,
                          AdmissionTicket* ticket,
                          OutputAllocator* output = nullptr);

// Timesteps a response answers, for the request logs and statistics
// (KServe's inference_count): for an embedding model the rows of every
// output (all its extents but the last); for a conditioning model the
// request's timesteps (its outputs' rows, or per token the index's
// elements), not the rows of each of its outputs added up.
int64_t TimestepsAnswered(const ServedModels& models,
                          const inference::ModelInferResponse& response);

}  // namespace temb::kserve

#endif  // TEMB_KSERVE_INFERENCE_H_
