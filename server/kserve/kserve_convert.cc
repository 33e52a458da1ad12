#include "temb/kserve/kserve_convert.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "inference/model_config.pb.h"
#include "temb/base/quoted.h"
#include "temb/base/status_macros.h"
#include "temb/core/timesteps.h"
#include "temb/kserve/tensor_type.h"

// Raw tensors are little-endian on the wire; decoding and encoding them with
// memcpy is only right on a little-endian host (x86-64, AArch64).
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the KServe frontend assumes a little-endian host");

namespace temb::kserve {
namespace {

using inference::InferParameter;
using inference::InferTensorContents;
using inference::ModelInferRequest;
using inference::ModelInferResponse;
using Params = google::protobuf::Map<std::string, InferParameter>;

// Request parameters from Triton's own clients that carry no meaning for a
// stateless, non-decoupled model; accepted and ignored so that those clients
// work as is.  Triton also reserves every key starting with "triton_" (e.g.
// perf_analyzer's "triton_enable_empty_final_response").
constexpr absl::string_view kIgnoredRequestParameters[] = {
    "priority",       "timeout",      "sequence_id",
    "sequence_start", "sequence_end", "binary_data_output"};
constexpr absl::string_view kTritonReservedPrefix = "triton_";

std::string ParamField(absl::string_view prefix, absl::string_view key) {
  return absl::StrCat(prefix, "parameters[", Quoted(key), "]");
}

absl::StatusOr<std::string> StringParam(const InferParameter& param,
                                        absl::string_view field) {
  if (param.parameter_choice_case() != InferParameter::kStringParam) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " must be a string parameter"));
  }
  return param.string_param();
}

// Accepts the KServe datatype names ("FP16") and temb's ("fp16",
// "float16"), in any case.
absl::StatusOr<DType> ParseDTypeParam(const InferParameter& param,
                                      absl::string_view field) {
  ASSIGN_OR_RETURN(std::string text, StringParam(param, field));
  absl::StatusOr<DType> dtype = ParseDType(absl::AsciiStrToLower(text));
  if (!dtype.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " must be one of FP32, FP16, BF16, FP64, got ", Quoted(text)));
  }
  return *dtype;
}

absl::Status ParseRequestParameters(const Params& params, SpecRequest* spec) {
  for (const auto& [key, param] : params) {
    const std::string field = ParamField("", key);
    if (key == "dtype") {
      ASSIGN_OR_RETURN(spec->dtype, ParseDTypeParam(param, field));
    } else if (key == "dim") {
      if (param.parameter_choice_case() != InferParameter::kInt64Param) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, " must be an int64 parameter"));
      }
      const int64_t dim = param.int64_param();
      // Anything outside int's range is far beyond any max_dim: let the core
      // report the limit rather than a truncated value.
      spec->dim = static_cast<int>(
          std::clamp<int64_t>(dim, std::numeric_limits<int>::min(),
                              std::numeric_limits<int>::max()));
    } else if (key == "timestep_dtype") {
      ASSIGN_OR_RETURN(spec->timestep_dtype, ParseDTypeParam(param, field));
    } else if (key == "precision") {
      ASSIGN_OR_RETURN(std::string text, StringParam(param, field));
      text = absl::AsciiStrToLower(text);
      if (text == "fp32") {
        spec->precision = Precision::kFloat32;
      } else if (text == "fp64") {
        spec->precision = Precision::kFloat64;
      } else {
        return absl::InvalidArgumentError(absl::StrCat(
            field, " must be \"fp32\" or \"fp64\", got ", Quoted(text)));
      }
    } else if (!IsIgnoredRequestParameter(key)) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown request parameter ", Quoted(key),
                       "; accepted: dtype, dim, precision, timestep_dtype"));
    }
  }
  return absl::OkStatus();
}

std::string ShapeString(const google::protobuf::RepeatedField<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

bool HasTypedContents(const InferTensorContents& c) {
  return c.bool_contents_size() > 0 || c.int_contents_size() > 0 ||
         c.int64_contents_size() > 0 || c.uint_contents_size() > 0 ||
         c.uint64_contents_size() > 0 || c.fp32_contents_size() > 0 ||
         c.fp64_contents_size() > 0 || c.bytes_contents_size() > 0;
}

// Raw little-endian bytes of `type` as float32 values: integers and FP64
// rounded once (as a pipeline's .float() does), FP16 and BF16 exactly.
std::vector<float> ValuesFromRaw(TensorType type, const std::string& bytes) {
  switch (type) {
    case TensorType::kInt64:
      return TimestepsFromRawBytes<int64_t>(bytes);
    case TensorType::kFp64:
      return TimestepsFromRawBytes<double>(bytes);
    case TensorType::kInt32:
      return TimestepsFromRawBytes<int32_t>(bytes);
    case TensorType::kFp16:
    case TensorType::kBf16: {
      std::vector<float> out(bytes.size() / 2);
      for (size_t i = 0; i < out.size(); ++i) {
        uint16_t bits;
        std::memcpy(&bits, bytes.data() + 2 * i, 2);
        out[i] = type == TensorType::kFp16 ? HalfToFloat(bits)
                                           : BFloat16ToFloat(bits);
      }
      return out;
    }
    default:
      return TimestepsFromRawBytes<float>(bytes);
  }
}

// The typed contents field each type travels in, with its element count in
// `contents`; FP16 and BF16 have none (raw contents only).
std::pair<absl::string_view, int> TypedField(TensorType type,
                                             const InferTensorContents& c) {
  switch (type) {
    case TensorType::kInt64:
      return {"int64_contents", c.int64_contents_size()};
    case TensorType::kFp64:
      return {"fp64_contents", c.fp64_contents_size()};
    case TensorType::kInt32:
      return {"int_contents", c.int_contents_size()};
    case TensorType::kFp32:
      return {"fp32_contents", c.fp32_contents_size()};
    default:
      return {"raw_input_contents", 0};
  }
}

std::vector<float> ValuesFromTyped(TensorType type,
                                   const InferTensorContents& c) {
  switch (type) {
    case TensorType::kInt64:
      return TimestepsAsFloat32(c.int64_contents());
    case TensorType::kFp64:
      return TimestepsAsFloat32(c.fp64_contents());
    case TensorType::kInt32:
      return TimestepsAsFloat32(c.int_contents());
    default:
      return TimestepsAsFloat32(c.fp32_contents());
  }
}

std::string TypeList(absl::Span<const TensorType> types) {
  std::string list;
  for (size_t i = 0; i < types.size(); ++i) {
    if (i > 0) list += i + 1 == types.size() ? " or " : ", ";
    absl::StrAppend(&list, TensorTypeName(types[i]));
  }
  return list;
}

}  // namespace

absl::Status DecodeInput(const ModelInferRequest& request, int i,
                         absl::Span<const TensorType> accepted, int max_rank,
                         std::vector<float>* values) {
  const auto& input = request.inputs(i);
  const std::string prefix = absl::StrCat("inputs[", i, "]");
  if (!input.parameters().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        ParamField(prefix + ".", input.parameters().begin()->first),
        " is not supported (inputs take the shared-memory parameters "
        "\"shared_memory_region\", \"shared_memory_offset\" and "
        "\"shared_memory_byte_size\" only)"));
  }

  const InferTensorContents& contents = input.contents();
  const std::optional<TensorType> type = ParseTensorType(input.datatype());
  if (!type.has_value() ||
      std::find(accepted.begin(), accepted.end(), *type) == accepted.end()) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, ".datatype must be ",
                                                   TypeList(accepted), ", got ",
                                                   Quoted(input.datatype())));
  }
  const absl::string_view type_name = TensorTypeName(*type);
  const size_t type_size = TensorTypeSize(*type);
  const auto [typed_field, typed_count] = TypedField(*type, contents);

  const auto& shape = input.shape();
  int64_t count = 1;
  for (const int64_t extent : shape) {
    if (extent < 0 || (extent > 0 && count > INT64_MAX / extent)) {
      count = -1;
      break;
    }
    count *= extent;
  }
  if (shape.empty() || shape.size() > max_rank || count < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, ".shape must have rank 1 to ", max_rank,
                     " and no negative dimension, got ", ShapeString(shape)));
  }

  if (request.raw_input_contents_size() > 0) {
    if (request.raw_input_contents_size() != request.inputs_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "raw_input_contents must hold one entry per input (",
          request.inputs_size(), "), got ", request.raw_input_contents_size()));
    }
    if (HasTypedContents(contents)) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, ".contents must be empty when raw_input_contents is set"));
    }
    const std::string& bytes = request.raw_input_contents(i);
    if (bytes.size() % type_size != 0 ||
        bytes.size() / type_size != static_cast<uint64_t>(count)) {
      return absl::InvalidArgumentError(
          absl::StrCat("raw_input_contents[", i, "] has ", bytes.size(),
                       " bytes, but shape ", ShapeString(shape), " of ",
                       type_name, " needs ", count, " x ", type_size));
    }
    *values = ValuesFromRaw(*type, bytes);
    return absl::OkStatus();
  }

  // Typed contents: only the field matching the datatype may be used.
  InferTensorContents others = contents;
  others.clear_fp32_contents();
  others.clear_int64_contents();
  others.clear_fp64_contents();
  others.clear_int_contents();
  const int typed_fields = (contents.fp32_contents_size() > 0) +
                           (contents.int64_contents_size() > 0) +
                           (contents.fp64_contents_size() > 0) +
                           (contents.int_contents_size() > 0);
  if (HasTypedContents(others) || typed_fields > 1 ||
      (typed_fields == 1 && typed_count == 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, ".contents: datatype ", type_name, " travels in ",
                     typed_field, " only"));
  }
  if (typed_count != count) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, ".contents.", typed_field, " has ", typed_count,
        " elements, but shape ", ShapeString(shape), " needs ", count));
  }
  *values = ValuesFromTyped(*type, contents);
  return absl::OkStatus();
}

bool IsIgnoredRequestParameter(absl::string_view key) {
  return absl::StartsWith(key, kTritonReservedPrefix) ||
         std::find(std::begin(kIgnoredRequestParameters),
                   std::end(kIgnoredRequestParameters),
                   key) != std::end(kIgnoredRequestParameters);
}

namespace {

// The timesteps an input of an embedding model holds: [N] and [N, 1]
// (Triton's batched scalar) give [N, dim]; any other shape of rank up to
// kMaxTimestepsRank gives shape + [dim].
absl::Status ParseInput(const ModelInferRequest& request, int i,
                        InferInput* out) {
  static constexpr TensorType kAccepted[] = {
      TensorType::kFp32, TensorType::kInt64, TensorType::kFp64,
      TensorType::kInt32};
  RETURN_IF_ERROR(
      DecodeInput(request, i, kAccepted, kMaxTimestepsRank, &out->timesteps));
  const auto& shape = request.inputs(i).shape();
  const bool batched_scalar =
      shape.size() == 1 || (shape.size() == 2 && shape[1] == 1);
  out->name = request.inputs(i).name();
  out->timesteps_shape.clear();
  if (!batched_scalar) out->timesteps_shape.assign(shape.begin(), shape.end());
  return absl::OkStatus();
}

// The part an input feeds: "timestep" for TIMESTEP, else its lower-cased
// name, which must be one of the model's parts.
absl::StatusOr<std::string> InputPart(const Preset& model, int i,
                                      const std::string& name) {
  if (name == kInputName) return std::string("timestep");
  const std::string part = absl::AsciiStrToLower(name);
  for (const PresetPart& known : model.parts) {
    if (known.name == part) return part;
  }
  std::vector<std::string> names = {kInputName};
  for (const PresetPart& known : model.parts) {
    if (known.name != "timestep") {
      names.push_back(absl::AsciiStrToUpper(known.name));
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "inputs[", i, "].name: unknown input ", Quoted(name), " of model \"",
      model.name, "\"; its inputs are ", absl::StrJoin(names, ", ")));
}

// -1 when the caller picks dim per request.
int64_t OutputDim(const Preset& model) {
  return model.dim_overridable ? -1 : model.spec.dim;
}

}  // namespace

absl::StatusOr<const Preset*> FindModel(const PresetCatalog& presets,
                                        absl::string_view name,
                                        absl::string_view version) {
  const Preset* model = presets.Find(name);
  if (model == nullptr) {
    // Not "the models are the presets": a repository's models are models
    // too, and the caller asked for neither.
    return absl::NotFoundError(absl::StrCat("unknown model ", Quoted(name)));
  }
  if (!version.empty() && version != kModelVersion) {
    return absl::NotFoundError(
        absl::StrCat("model \"", name, "\" has no version ", Quoted(version),
                     "; its only version is \"", kModelVersion, "\""));
  }
  return model;
}

absl::StatusOr<InferCall> ParseInferRequest(const ModelInferRequest& request,
                                            const Preset& model) {
  InferCall call;
  call.spec.preset = model.name;
  call.spec.preset_entry = &model;  // the core need not look it up again
  RETURN_IF_ERROR(ParseRequestParameters(request.parameters(), &call.spec));
  if (request.inputs_size() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("inputs: model \"", model.name, "\" needs input \"",
                     kInputName, "\" (or its parts' inputs), got none"));
  }
  for (int i = 0; i < request.inputs_size(); ++i) {
    InferInput input;
    ASSIGN_OR_RETURN(input.part, InputPart(model, i, request.inputs(i).name()));
    RETURN_IF_ERROR(ParseInput(request, i, &input));
    call.inputs.push_back(std::move(input));
  }
  for (int o = 0; o < request.outputs_size(); ++o) {
    const auto& output = request.outputs(o);
    InferInput* input = nullptr;
    for (InferInput& candidate : call.inputs) {
      if (OutputNameFor(candidate.name) == output.name()) input = &candidate;
    }
    if (input == nullptr) {
      std::vector<std::string> names;
      for (const InferInput& candidate : call.inputs) {
        names.push_back(OutputNameFor(candidate.name));
      }
      return absl::InvalidArgumentError(absl::StrCat(
          "outputs[", o, "].name: unknown output ", Quoted(output.name()),
          " of model \"", model.name, "\"; this request's outputs are ",
          absl::StrJoin(names, ", ")));
    }
    for (const auto& [key, param] : output.parameters()) {
      const std::string field =
          ParamField(absl::StrCat("outputs[", o, "]."), key);
      if (key == "datatype") {
        ASSIGN_OR_RETURN(DType dtype, ParseDTypeParam(param, field));
        if (call.spec.dtype.has_value() && *call.spec.dtype != dtype) {
          return absl::InvalidArgumentError(
              absl::StrCat(field, " (", DTypeName(dtype),
                           ") contradicts the request parameter \"dtype\" (",
                           DTypeName(*call.spec.dtype), ")"));
        }
        input->dtype = dtype;
      } else if (key != "binary_data") {  // HTTP-only; gRPC is always binary
        return absl::InvalidArgumentError(
            absl::StrCat(field, " is not supported; accepted: datatype"));
      }
    }
  }
  return call;
}

inference::DataType ConfigDataType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return inference::TYPE_FP32;
    case DType::kFloat16:
      return inference::TYPE_FP16;
    case DType::kBFloat16:
      return inference::TYPE_BF16;
    case DType::kFloat64:
      return inference::TYPE_FP64;
  }
  return inference::TYPE_FP32;
}

std::string OutputNameFor(absl::string_view input_name) {
  if (input_name == kInputName) return kOutputName;
  return absl::StrCat(input_name, "_", kOutputName);
}

void FillInferResponse(const ModelInferRequest& request, Embedding embedding,
                       ModelInferResponse* response) {
  InferInput input;
  input.name = kInputName;
  AddInferOutput(input, std::move(embedding), /*with_bytes=*/true, response);
  response->set_model_name(request.model_name());
  response->set_model_version(kModelVersion);
  response->set_id(request.id());
}

void AddInferOutput(const InferInput& input, Embedding embedding,
                    bool with_bytes, ModelInferResponse* response) {
  auto* output = response->add_outputs();
  output->set_name(OutputNameFor(input.name));
  output->set_datatype(
      std::string(TensorTypeName(TensorTypeOf(embedding.spec.dtype))));
  if (input.timesteps_shape.empty()) {
    output->add_shape(embedding.rows);
  } else {
    output->mutable_shape()->Add(input.timesteps_shape.begin(),
                                 input.timesteps_shape.end());
  }
  output->add_shape(embedding.spec.dim);
  if (with_bytes) response->add_raw_output_contents(std::move(embedding.data));
}

absl::Status Infer(const EmbedService& service,
                   const ModelInferRequest& request,
                   ModelInferResponse* response, AdmissionTicket* ticket,
                   OutputAllocator* output) {
  ASSIGN_OR_RETURN(const Preset* model,
                   FindModel(service.presets(), request.model_name(),
                             request.model_version()));
  ASSIGN_OR_RETURN(const InferCall call, ParseInferRequest(request, *model));
  Request served_request;
  served_request.request_id = request.id();
  served_request.spec = call.spec;
  served_request.named_parts = call.inputs.size() > 1;
  served_request.request_id_field = "id";
  served_request.parts_field = "inputs";
  served_request.shape_field = "shape";
  for (size_t i = 0; i < call.inputs.size(); ++i) {
    const InferInput& input = call.inputs[i];
    RequestPart part;
    part.name = input.part;
    part.field = absl::StrCat("inputs[", i, "]");
    part.spec.dtype = input.dtype;
    part.timesteps = input.timesteps;
    part.timesteps_shape = input.timesteps_shape;
    served_request.parts.push_back(std::move(part));
  }
  // One input is computed into `output` (sent without a copy); several are
  // moved into raw_output_contents.
  OutputAllocator* const into_output[] = {output};
  const bool single = call.inputs.size() == 1 && output != nullptr;
  ASSIGN_OR_RETURN(
      Response served,
      service.Serve(served_request, ticket,
                    single ? absl::MakeConstSpan(into_output)
                           : absl::Span<OutputAllocator* const>()));
  response->set_model_name(request.model_name());
  response->set_model_version(kModelVersion);
  response->set_id(request.id());
  for (size_t i = 0; i < call.inputs.size(); ++i) {
    // With `output`, the bytes are in its memory: the caller appends them.
    AddInferOutput(call.inputs[i], std::move(served.parts[i].embedding),
                   !single, response);
  }
  return absl::OkStatus();
}

void FillModelMetadata(const Preset& model,
                       inference::ModelMetadataResponse* response) {
  response->set_name(model.name);
  response->add_versions(kModelVersion);
  response->set_platform(kPlatform);
  auto* input = response->add_inputs();
  input->set_name(kInputName);
  input->set_datatype(std::string(TensorTypeName(TensorType::kFp32)));
  input->add_shape(-1);
  input->add_shape(1);
  auto* output = response->add_outputs();
  output->set_name(kOutputName);
  output->set_datatype(
      std::string(TensorTypeName(TensorTypeOf(model.spec.dtype))));
  output->add_shape(-1);
  output->add_shape(OutputDim(model));
}

void FillModelConfig(const Preset& model, const Limits& limits,
                     inference::ModelConfig* config) {
  config->set_name(model.name);
  config->set_platform(kPlatform);
  config->set_backend(kPlatform);
  config->set_max_batch_size(static_cast<int32_t>(std::clamp<int64_t>(
      limits.max_batch, 1, std::numeric_limits<int32_t>::max())));
  auto* input = config->add_input();
  input->set_name(kInputName);
  input->set_data_type(inference::TYPE_FP32);
  input->add_dims(1);
  auto* output = config->add_output();
  output->set_name(kOutputName);
  output->set_data_type(ConfigDataType(model.spec.dtype));
  output->add_dims(OutputDim(model));
}

void FillServerMetadata(absl::string_view version,
                        inference::ServerMetadataResponse* response) {
  response->set_name("temb");
  response->set_version(std::string(version));
  response->add_extensions("model_configuration");
  response->add_extensions("parameters");
  // ModelStatistics (gRPC), GET .../stats (REST): perf_analyzer polls them
  // and prints the server-side breakdown (model_statistics.h).
  response->add_extensions("statistics");
  // Tensors in POSIX shared memory (shared_memory.h); not CUDA's.
  response->add_extensions("system_shared_memory");
}

}  // namespace temb::kserve
