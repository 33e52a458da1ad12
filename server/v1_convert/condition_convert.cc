#include "temb/v1_convert/condition_convert.h"

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "temb/core/embed_service.h"
#include "temb/kernels/dtype.h"
#include "temb/v1_convert/conversions.h"

namespace temb {
namespace {

absl::Status Invalid(const std::string& field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

// The element size of an input dtype, 0 for one an input may not have.
size_t InputElementBytes(int dtype) {
  switch (dtype) {
    case v1::DTYPE_FP32:
      return 4;
    case v1::DTYPE_FP64:
      return 8;
    case v1::DTYPE_FP16:
    case v1::DTYPE_BF16:
      return 2;
  }
  return 0;
}

// `data` (little-endian elements of `dtype`) as float32, exactly.
absl::Status DecodeInput(const std::string& field, int dtype,
                         const std::string& data, std::vector<float>* out) {
  const size_t size = InputElementBytes(dtype);
  if (size == 0) {
    return Invalid(
        field + ".tensor.dtype",
        absl::StrCat("an input must be FP32, FP64 (exactly float32 "
                     "values), FP16 or BF16, got ",
                     v1::DType_IsValid(dtype)
                         ? v1::DType_Name(static_cast<v1::DType>(dtype))
                         : absl::StrCat(dtype)));
  }
  if (data.size() % size != 0) {
    return Invalid(
        field + ".tensor.data",
        absl::StrCat(data.size(), " bytes are not a whole number of ", size,
                     "-byte elements"));
  }
  const size_t count = data.size() / size;
  out->resize(count);
  const char* bytes = data.data();
  for (size_t i = 0; i < count; ++i) {
    switch (dtype) {
      case v1::DTYPE_FP32:
        std::memcpy(&(*out)[i], bytes + 4 * i, 4);
        break;
      case v1::DTYPE_FP16:
      case v1::DTYPE_BF16: {
        uint16_t bits;
        std::memcpy(&bits, bytes + 2 * i, 2);
        (*out)[i] =
            dtype == v1::DTYPE_FP16 ? HalfToFloat(bits) : BFloat16ToFloat(bits);
        break;
      }
      case v1::DTYPE_FP64: {
        double value;
        std::memcpy(&value, bytes + 8 * i, 8);
        // NaN passes through: the core refuses it with its own message.
        const bool exact =
            std::isnan(value) || std::isinf(value) ||
            (std::fabs(value) <= FLT_MAX &&
             static_cast<double>(static_cast<float>(value)) == value);
        if (!exact) {
          return Invalid(
              absl::StrCat(field, ".tensor.data[", i, "]"),
              absl::StrCat("the FP64 value ", absl::StrFormat("%.17g", value),
                           " is not exactly a float32; send the float32 "
                           "values the pipeline computes with"));
        }
        (*out)[i] = static_cast<float>(value);
        break;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ConditionRequest> ConditionRequestFromProto(
    const v1::ConditionRequest& request,
    std::vector<std::vector<float>>* storage) {
  if (request.request_id().size() > kMaxRequestIdBytes) {
    return Invalid("request_id",
                   absl::StrCat("must be at most ", kMaxRequestIdBytes,
                                " bytes, got ", request.request_id().size()));
  }
  ConditionRequest call;
  call.model = request.model();
  call.request_id = request.request_id();
  storage->clear();
  storage->resize(request.inputs_size());
  for (int i = 0; i < request.inputs_size(); ++i) {
    const v1::NamedTensor& named = request.inputs(i);
    const std::string field = absl::StrCat("inputs[", i, "]");
    if (named.name().empty()) {
      return Invalid(field + ".name",
                     "an input needs a name, e.g. \"timesteps\"");
    }
    const v1::Tensor& tensor = named.tensor();
    absl::Status decoded =
        DecodeInput(field, tensor.dtype(), tensor.data(), &(*storage)[i]);
    if (!decoded.ok()) return decoded;
    ConditionInput input;
    input.name = named.name();
    input.field = field;
    input.values = (*storage)[i];
    if (tensor.shape_size() == 0) {
      // No shape: a vector of the values.
      input.shape = {static_cast<int64_t>((*storage)[i].size())};
    } else {
      input.shape.assign(tensor.shape().begin(), tensor.shape().end());
    }
    call.inputs.push_back(std::move(input));
  }
  call.outputs.assign(request.outputs().begin(), request.outputs().end());
  return call;
}

v1::ConditionResponse ConditionResponseToProto(ConditionResponse response,
                                               const std::string& request_id) {
  v1::ConditionResponse out;
  out.set_request_id(request_id);
  out.set_model(std::move(response.model));
  for (ConditionOutput& output : response.outputs) {
    v1::NamedTensor* named = out.add_outputs();
    named->set_name(std::move(output.name));
    v1::Tensor* tensor = named->mutable_tensor();
    tensor->mutable_shape()->Add(output.shape.begin(), output.shape.end());
    tensor->set_dtype(output.index ? v1::DTYPE_INT64
                                   : DTypeToProto(output.dtype));
    tensor->set_data(std::move(output.data));
  }
  return out;
}

void ConditioningModelToProto(const ConditioningModelInfo& model,
                              v1::ConditioningModel* out) {
  out->set_name(model.name);
  switch (model.state) {
    case ModelState::kLoading:
      out->set_state(v1::MODEL_STATE_LOADING);
      break;
    case ModelState::kReady:
      out->set_state(v1::MODEL_STATE_READY);
      break;
    case ModelState::kFailed:
      out->set_state(v1::MODEL_STATE_FAILED);
      break;
    case ModelState::kUnloaded:
      out->set_state(v1::MODEL_STATE_UNLOADED);
      break;
  }
  out->set_message(model.message);
  if (model.state != ModelState::kReady) return;
  out->set_family(model.family);
  out->set_dtype(DTypeToProto(model.dtype));
  out->set_width(model.width);
  out->set_weight_bytes(model.weight_bytes);
  out->mutable_weight_fingerprints()->insert(model.weight_fingerprints.begin(),
                                             model.weight_fingerprints.end());
  for (const models::InputInfo& input : model.inputs) {
    v1::ConditioningInput* in = out->add_inputs();
    in->set_name(input.name);
    in->set_width(input.width);
    in->set_help(input.help);
    in->set_stands_for(input.stands_for);
    in->set_instead_of(input.instead_of);
    in->set_module(input.module);
    in->set_argument(input.argument);
    in->set_in_model_dtype(input.in_model_dtype);
  }
  for (const models::OutputInfo& output : model.outputs) {
    v1::ConditioningOutput* o = out->add_outputs();
    o->set_name(output.name);
    o->set_dtype(DTypeToProto(output.dtype));
    o->mutable_row_shape()->Add(output.row_shape.begin(),
                                output.row_shape.end());
    o->set_row_bytes(output.row_bytes);
    o->set_layout(output.layout);
    o->set_replaces(output.replaces);
    o->set_replaced_kind(output.replaced_kind);
    o->mutable_blocks()->Add(output.blocks.begin(), output.blocks.end());
    o->set_input_module(output.input_module);
    o->set_embedding(output.embedding);
  }
  for (const models::FoldedModuleInfo& folded : model.folded_modules) {
    v1::ConditioningFoldedModule* f = out->add_folded_modules();
    f->set_module(folded.module);
    f->set_kind(folded.kind);
  }
  out->set_class_name(model.class_name);
  out->mutable_config()->insert(model.config.begin(), model.config.end());
  for (const std::string& result : model.embedder_results) {
    out->add_embedder_results(result);
  }
}

void AddConditioningToServerInfo(const ConditioningService& service,
                                 v1::ServerInfo* info) {
  for (const ConditioningModelInfo& model : service.Models()) {
    ConditioningModelToProto(model, info->add_conditioning_models());
  }
  const models::RowCacheStats stats = service.cache_stats();
  v1::RowCacheStats* cache = info->mutable_conditioning_cache();
  cache->set_hits(stats.hits);
  cache->set_misses(stats.misses);
  cache->set_entries(stats.entries);
  cache->set_bytes(stats.bytes);
  cache->set_evictions(stats.evictions);
  cache->set_capacity_bytes(stats.capacity_bytes);
}

}  // namespace temb
