#include "temb/kserve/conditioning_convert.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "temb/base/quoted.h"
#include "temb/base/status_macros.h"
#include "temb/kserve/kserve_convert.h"
#include "temb/kserve/tensor_type.h"

namespace temb::kserve {
namespace {

using inference::ModelInferRequest;
using inference::ModelInferResponse;

// Scalar inputs are numbers a scheduler or a caller writes; row inputs
// (pooled projections) are what a text encoder gave, in its dtype.
constexpr TensorType kScalarTypes[] = {TensorType::kFp32, TensorType::kFp64,
                                       TensorType::kInt64, TensorType::kInt32};
constexpr TensorType kRowTypes[] = {TensorType::kFp32,  TensorType::kFp64,
                                    TensorType::kBf16,  TensorType::kFp16,
                                    TensorType::kInt64, TensorType::kInt32};
// Per-token timesteps: [B, L] and the video layouts some models use (the
// core's bound, checked here before decoding).
constexpr int kMaxInputRank = static_cast<int>(kMaxConditionInputRank);

// The config parameters naming what `output` stands for in the transformer
// (kReplacesKey and the keys beside it); none for an output without.
void AddReplacedParameters(
    const models::OutputInfo& output,
    google::protobuf::Map<std::string, inference::ModelParameter>& parameters) {
  if (output.replaces.empty()) return;
  parameters[absl::StrCat(kReplacesKey, output.name)].set_string_value(
      output.replaces);
  parameters[absl::StrCat(kReplacedKindKey, output.name)].set_string_value(
      output.replaced_kind);
  if (!output.blocks.empty()) {
    parameters[absl::StrCat(kBlocksKey, output.name)].set_string_value(
        absl::StrJoin(output.blocks, ","));
  }
  if (!output.input_module.empty()) {
    parameters[absl::StrCat(kInputModuleKey, output.name)].set_string_value(
        output.input_module);
  }
  if (!output.embedding.empty()) {
    parameters[absl::StrCat(kEmbeddingKey, output.name)].set_string_value(
        output.embedding);
  }
}

// Where an offload patch captures the input, and what a stand-in replaces.
void AddCaptureParameters(
    const models::InputInfo& input,
    google::protobuf::Map<std::string, inference::ModelParameter>& parameters) {
  if (!input.argument.empty()) {
    parameters[absl::StrCat(kModuleKey, input.name)].set_string_value(
        input.module);
    parameters[absl::StrCat(kArgumentKey, input.name)].set_string_value(
        input.argument);
  }
  if (!input.instead_of.empty()) {
    parameters[absl::StrCat(kInsteadOfKey, input.name)].set_string_value(
        input.instead_of);
  }
  if (input.in_model_dtype) {
    parameters[absl::StrCat(kInModelDTypeKey, input.name)].set_string_value(
        "true");
  }
}

}  // namespace

absl::StatusOr<ConditioningModelInfo> FindConditioningModel(
    const ConditioningService& service, absl::string_view name,
    absl::string_view version) {
  ASSIGN_OR_RETURN(ConditioningModelInfo model, service.Model(name));
  if (!version.empty() && version != kModelVersion) {
    return absl::NotFoundError(absl::StrCat(
        "model ", Quoted(name), " has no version ", Quoted(version),
        "; its only version is \"", kModelVersion, "\""));
  }
  if (model.state == ModelState::kLoading) {
    return absl::FailedPreconditionError(
        absl::StrCat("model ", Quoted(name), " is still loading"));
  }
  if (model.state == ModelState::kFailed) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model ", Quoted(name), " failed to load: ", model.message));
  }
  if (model.state == ModelState::kUnloaded) {
    return absl::FailedPreconditionError(
        absl::StrCat("model ", Quoted(name), " is unloaded"));
  }
  return model;
}

absl::StatusOr<std::unique_ptr<ConditionCall>> ParseConditionRequest(
    const ModelInferRequest& request, const ConditioningModelInfo& model) {
  for (const auto& [key, param] : request.parameters()) {
    if (!IsIgnoredRequestParameter(key)) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameters[", Quoted(key), "]: conditioning model ",
                       Quoted(model.name), " takes no request parameters"));
    }
  }
  auto call = std::make_unique<ConditionCall>();
  call->values.resize(request.inputs_size());
  for (int i = 0; i < request.inputs_size(); ++i) {
    const auto& input = request.inputs(i);
    const auto spec = std::find_if(model.inputs.begin(), model.inputs.end(),
                                   [&](const models::InputInfo& info) {
                                     return info.name == input.name();
                                   });
    if (spec == model.inputs.end()) {
      std::vector<std::string> names;
      for (const models::InputInfo& info : model.inputs) {
        names.push_back(info.name);
      }
      return absl::InvalidArgumentError(
          absl::StrCat("inputs[", i, "].name: unknown input ",
                       Quoted(input.name()), " of model ", Quoted(model.name),
                       "; its inputs are ", absl::StrJoin(names, ", ")));
    }
    const bool row = spec->width > 0;
    if (row) {
      RETURN_IF_ERROR(
          DecodeInput(request, i, kRowTypes, kMaxInputRank, &call->values[i]));
    } else {
      RETURN_IF_ERROR(DecodeInput(request, i, kScalarTypes, kMaxInputRank,
                                  &call->values[i]));
    }
    ConditionInput parsed;
    parsed.name = input.name();
    parsed.field = absl::StrCat("inputs[", i, "]");
    parsed.values = call->values[i];
    parsed.shape.assign(input.shape().begin(), input.shape().end());
    // [N, 1] is Triton's batched scalar: [N].
    if (!row && parsed.shape.size() == 2 && parsed.shape[1] == 1) {
      parsed.shape.pop_back();
    }
    call->request.inputs.push_back(std::move(parsed));
  }
  for (int o = 0; o < request.outputs_size(); ++o) {
    const auto& output = request.outputs(o);
    for (const auto& [key, param] : output.parameters()) {
      // binary_data is HTTP's choice of encoding; gRPC is always binary.
      if (key != "binary_data") {
        return absl::InvalidArgumentError(
            absl::StrCat("outputs[", o, "].parameters[", Quoted(key),
                         "] is not supported by a conditioning model"));
      }
    }
    call->request.outputs.push_back(output.name());
  }
  call->request.request_id = request.id();
  call->request.model_field = "model_name";
  call->request.outputs_field = "outputs";
  return call;
}

absl::Status InferConditioning(const ConditioningService& service,
                               const ModelInferRequest& request,
                               ModelInferResponse* response,
                               AdmissionTicket* ticket) {
  ASSIGN_OR_RETURN(const ConditioningModelInfo model,
                   FindConditioningModel(service, request.model_name(),
                                         request.model_version()));
  ASSIGN_OR_RETURN(std::unique_ptr<ConditionCall> call,
                   ParseConditionRequest(request, model));
  call->request.model = model.name;
  ASSIGN_OR_RETURN(ConditionResponse answer,
                   service.Serve(call->request, ticket));
  response->set_model_name(request.model_name());
  response->set_model_version(kModelVersion);
  response->set_id(request.id());
  for (ConditionOutput& output : answer.outputs) {
    auto* tensor = response->add_outputs();
    tensor->set_name(output.name);
    tensor->set_datatype(std::string(TensorTypeName(
        output.index ? TensorType::kInt64 : TensorTypeOf(output.dtype))));
    tensor->mutable_shape()->Add(output.shape.begin(), output.shape.end());
    response->add_raw_output_contents(std::move(output.data));
  }
  return absl::OkStatus();
}

void FillModelIndex(const ConditioningService::IndexEntry& entry,
                    inference::RepositoryIndexResponse::ModelIndex* index) {
  index->set_name(entry.name);
  index->set_version(std::string(kModelVersion));
  switch (entry.state) {
    case ModelState::kReady:
      index->set_state("READY");
      break;
    case ModelState::kLoading:
      index->set_state("LOADING");
      break;
    case ModelState::kFailed:
    case ModelState::kUnloaded:
      index->set_state("UNAVAILABLE");
      break;
  }
  index->set_reason(entry.reason);
}

void FillConditioningMetadata(const ConditioningModelInfo& model,
                              inference::ModelMetadataResponse* response) {
  response->set_name(model.name);
  response->add_versions(kModelVersion);
  response->set_platform(kPlatform);
  for (const models::InputInfo& info : model.inputs) {
    // The forward's timestep is an alternative to "timesteps", named in the
    // config's parameters: listed, tools that send every input
    // (perf_analyzer) would send both.
    if (!info.stands_for.empty()) continue;
    auto* input = response->add_inputs();
    input->set_name(info.name);
    input->set_datatype(std::string(TensorTypeName(TensorType::kFp32)));
    // The batch dimension, then the config's dims (FillConditioningConfig):
    // a per-row scalar is [-1, 1] as Triton writes dims [1] with batching.
    // perf_analyzer builds its requests from this shape and cannot send a
    // per-row shape of []; [N] is accepted all the same.
    input->add_shape(-1);
    input->add_shape(info.width > 0 ? info.width : 1);
  }
  for (const models::OutputInfo& info : model.outputs) {
    auto* output = response->add_outputs();
    output->set_name(info.name);
    output->set_datatype(std::string(TensorTypeName(TensorTypeOf(info.dtype))));
    output->add_shape(-1);
    for (const int64_t extent : info.row_shape) output->add_shape(extent);
  }
}

void FillConditioningConfig(const ConditioningModelInfo& model,
                            const Limits& limits,
                            inference::ModelConfig* config) {
  config->set_name(model.name);
  config->set_platform(kPlatform);
  config->set_backend(kPlatform);
  const int64_t rows =
      std::min<int64_t>(limits.max_batch, models::kMaxConditioningRows);
  config->set_max_batch_size(static_cast<int32_t>(
      std::clamp<int64_t>(rows, 1, std::numeric_limits<int32_t>::max())));
  auto& parameters = *config->mutable_parameters();
  for (const models::InputInfo& info : model.inputs) {
    AddCaptureParameters(info, parameters);
    if (!info.stands_for.empty()) {
      // What the alternative input stands for (ConditioningInput's
      // stands_for in temb's own API).
      parameters[absl::StrCat(kStandsForKey, info.name)].set_string_value(
          info.stands_for);
      continue;
    }
    auto* input = config->add_input();
    input->set_name(info.name);
    input->set_data_type(inference::TYPE_FP32);
    input->add_dims(info.width > 0 ? info.width : 1);
  }
  for (const models::OutputInfo& info : model.outputs) {
    auto* output = config->add_output();
    output->set_name(info.name);
    output->set_data_type(ConfigDataType(info.dtype));
    for (const int64_t extent : info.row_shape) output->add_dims(extent);
    if (info.row_shape.empty()) output->add_dims(1);
    AddReplacedParameters(info, *config->mutable_parameters());
  }
  for (const models::FoldedModuleInfo& folded : model.folded_modules) {
    (*config
          ->mutable_parameters())[absl::StrCat(kFoldedModuleKey, folded.module)]
        .set_string_value(folded.kind);
  }
  parameters[kClassNameKey].set_string_value(model.class_name);
  for (const auto& [field, text] : model.config) {
    parameters[absl::StrCat(kConfigKey, field)].set_string_value(text);
  }
  if (!model.embedder_results.empty()) {
    parameters[kEmbedderResultsKey].set_string_value(
        absl::StrJoin(model.embedder_results, ","));
  }
  // The weights' identity (temb/models/weight_fingerprint.h), for a client
  // that holds the same checkpoint and would check it is served this one.
  for (const auto& [tensor, fingerprint] : model.weight_fingerprints) {
    (*config->mutable_parameters())[absl::StrCat(kWeightFingerprintKey, tensor)]
        .set_string_value(fingerprint);
  }
}

}  // namespace temb::kserve
