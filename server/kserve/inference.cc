#include "temb/kserve/inference.h"

#include <algorithm>
#include <vector>

#include "temb/base/status_macros.h"
#include "temb/kserve/conditioning_convert.h"
#include "temb/kserve/kserve_convert.h"

namespace temb::kserve {

std::vector<std::string> ServedModels::Names() const {
  std::vector<std::string> names;
  for (const Preset& preset : core.presets().presets()) {
    if (!IsConditioning(preset.name)) names.push_back(preset.name);
  }
  if (conditioning != nullptr) {
    for (const ConditioningModelInfo& model : conditioning->Models()) {
      names.push_back(model.name);
    }
  }
  return names;
}

bool ServedModels::Ready(absl::string_view name,
                         absl::string_view version) const {
  if (IsConditioning(name)) {
    return FindConditioningModel(*conditioning, name, version).ok();
  }
  return FindModel(core.presets(), name, version).ok();
}

bool ServedModels::RepositoryReady() const {
  return conditioning == nullptr || conditioning->RepositoryReady();
}

absl::Status ServedModels::FillMetadata(
    absl::string_view name, absl::string_view version,
    inference::ModelMetadataResponse* response) const {
  if (IsConditioning(name)) {
    ASSIGN_OR_RETURN(const ConditioningModelInfo model,
                     FindConditioningModel(*conditioning, name, version));
    FillConditioningMetadata(model, response);
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(const Preset* preset,
                   FindModel(core.presets(), name, version));
  FillModelMetadata(*preset, response);
  return absl::OkStatus();
}

absl::Status ServedModels::FillConfig(absl::string_view name,
                                      absl::string_view version,
                                      inference::ModelConfig* config) const {
  if (IsConditioning(name)) {
    ASSIGN_OR_RETURN(const ConditioningModelInfo model,
                     FindConditioningModel(*conditioning, name, version));
    FillConditioningConfig(model, conditioning->limits(), config);
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(const Preset* preset,
                   FindModel(core.presets(), name, version));
  FillModelConfig(*preset, core.limits(), config);
  return absl::OkStatus();
}

namespace {

absl::Status InferModel(const ServedModels& models,
                        const inference::ModelInferRequest& request,
                        inference::ModelInferResponse* response,
                        AdmissionTicket* ticket, OutputAllocator* output) {
  if (models.IsConditioning(request.model_name())) {
    return InferConditioning(*models.conditioning, request, response, ticket);
  }
  return Infer(models.core, request, response, ticket, output);
}

}  // namespace

absl::Status RunInference(const ServedModels& models,
                          const SharedMemoryRegistry* shared_memory,
                          const inference::ModelInferRequest& request,
                          inference::ModelInferResponse* response,
                          AdmissionTicket* ticket, OutputAllocator* output) {
  if (!UsesSharedMemory(request)) {
    return InferModel(models, request, response, ticket, output);
  }
  if (shared_memory == nullptr) {
    return absl::InvalidArgumentError("shared memory is not enabled");
  }
  // The inputs' bytes are copied in, the outputs written out, around the
  // same inference.
  inference::ModelInferRequest resolved = request;
  std::vector<SharedMemoryOutput> targets;
  // No valid embedding input is wider than max_batch 8-byte timesteps; a
  // conditioning input is bounded as one gRPC message would bound it.
  const uint64_t max_input_bytes = static_cast<uint64_t>(std::max<int64_t>(
                                       models.core.limits().max_batch, 0)) *
                                   8;
  absl::Status status = PrepareSharedMemory(*shared_memory, max_input_bytes,
                                            ticket, &resolved, &targets);
  if (status.ok()) {
    status = InferModel(models, resolved, response, ticket, nullptr);
  }
  if (status.ok()) status = FinishSharedMemory(targets, response);
  return status;
}

int64_t TimestepsAnswered(const ServedModels& models,
                          const inference::ModelInferResponse& response) {
  if (models.IsConditioning(response.model_name())) {
    // Every output holds the same rows; per-token timesteps are as many
    // as the index's elements.
    for (const auto& output : response.outputs()) {
      if (output.name() == kConditionIndex) {
        int64_t tokens = 1;
        for (const int64_t extent : output.shape()) tokens *= extent;
        return tokens;
      }
    }
    return response.outputs().empty() || response.outputs(0).shape().empty()
               ? 0
               : response.outputs(0).shape(0);
  }
  int64_t batch = 0;
  for (const auto& output : response.outputs()) {
    int64_t rows = 1;
    for (int d = 0; d + 1 < output.shape_size(); ++d) rows *= output.shape(d);
    batch += rows;
  }
  return batch;
}

}  // namespace temb::kserve
