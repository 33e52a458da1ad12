// KServe v2 <-> service core: the only place that knows both the inference.*
// messages and the core's types.  No gRPC runtime here (only the generated
// protobuf messages), so every rule below is testable without a server.
//
// The model repository is the preset catalogue: model "<preset>", version
// "1", input TIMESTEP ([N] or [N, 1] of FP32, INT64, FP64 or INT32), output
// EMBEDDING ([N, dim] of FP32, FP16, BF16 or FP64).  Per-request choices ride
// in parameters (see docs/kserve.md):
//   request  "dtype"      string  FP32 | FP16 | BF16 | FP64 (any case; also
//                                 float32, float16, bfloat16, float64)
//   request  "dim"        int64   only for presets with a caller-chosen dim
//   request  "precision"  string  fp32 | fp64
//   request  "timestep_dtype" string  FP32 | FP16 | BF16: t as a pipeline of
//                                 that dtype holds it (EmbeddingSpec)
//   output   "datatype"   string  as "dtype" (must agree when both are set)
#ifndef TEMB_KSERVE_KSERVE_CONVERT_H_
#define TEMB_KSERVE_KSERVE_CONVERT_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "inference/grpc_service.pb.h"
#include "inference/model_config.pb.h"
#include "temb/core/embed_service.h"
#include "temb/core/presets.h"
#include "temb/kserve/tensor_type.h"

namespace temb::kserve {

inline constexpr char kInputName[] = "TIMESTEP";
inline constexpr char kOutputName[] = "EMBEDDING";
inline constexpr char kModelVersion[] = "1";
inline constexpr char kPlatform[] = "temb";

// One input tensor of an inference call: TIMESTEP, or an input named after
// one of the model's parts (GUIDANCE for flux's "guidance", R, ADD_TIME,
// ...).  Each gives one output: EMBEDDING for TIMESTEP, <NAME>_EMBEDDING
// for the others.
struct InferInput {
  std::string name;
  std::string part;  // "timestep" for TIMESTEP, else the lower-cased name
  std::vector<float> timesteps;
  // Empty for inputs of shape [N] or [N, 1] (output [N, dim]); otherwise
  // the input's shape (output shape + [dim]).
  std::vector<int64_t> timesteps_shape;
  std::optional<DType> dtype;  // the output's "datatype" parameter
};

// One inference call in core terms.
struct InferCall {
  SpecRequest spec;  // spec.preset is the model name
  std::vector<InferInput> inputs;
};

// Decodes input `i` of `request` (its raw_input_contents entry or its typed
// contents) to float32 values: integers and FP64 rounded once, FP16 and
// BF16 exactly.  Its datatype must be one of `accepted` and its shape of
// rank 1 to `max_rank`, holding exactly the values given.  INVALID_ARGUMENT
// naming the field otherwise.  Every model's inputs are read here.
absl::Status DecodeInput(const inference::ModelInferRequest& request, int i,
                         absl::Span<const TensorType> accepted, int max_rank,
                         std::vector<float>* values);

// Request parameters Triton's own clients send that mean nothing to a
// stateless model ("priority", "timeout", the sequence fields,
// "binary_data_output", any "triton_*"): accepted and ignored.
bool IsIgnoredRequestParameter(absl::string_view key);

// The output an input gives: EMBEDDING for TIMESTEP, else NAME_EMBEDDING.
std::string OutputNameFor(absl::string_view input_name);

// The model `name` at `version` ("" or "1").  NOT_FOUND otherwise.
absl::StatusOr<const Preset*> FindModel(const PresetCatalog& presets,
                                        absl::string_view name,
                                        absl::string_view version);

// Checks the request's tensors and parameters against the model's signature
// and decodes the timesteps (raw little-endian bytes or typed contents) to
// float32.  INVALID_ARGUMENT naming the offending field, e.g.
// "inputs[0].datatype must be FP32, INT64, FP64 or INT32, got \"UINT8\"".  Spec
// fields (dim range, precision rules) and timestep values are left to the core.
absl::StatusOr<InferCall> ParseInferRequest(
    const inference::ModelInferRequest& request, const Preset& model);

// The response for a single-input `request`: id echoed, output EMBEDDING
// [rows, dim] with the embedding's bytes moved into raw_output_contents.
void FillInferResponse(const inference::ModelInferRequest& request,
                       Embedding embedding,
                       inference::ModelInferResponse* response);

// Appends the output of `input` (name, datatype, shape) and, `with_bytes`,
// its bytes (moved from embedding.data) to raw_output_contents.
void AddInferOutput(const InferInput& input, Embedding embedding,
                    bool with_bytes, inference::ModelInferResponse* response);

// FindModel, ParseInferRequest, EmbedService::Embed, FillInferResponse.
// Codes: NOT_FOUND (model), INVALID_ARGUMENT, RESOURCE_EXHAUSTED (limits),
// or the backend's error.  `ticket` (may be null) as in EmbedService::Embed.
// With `output` and a single input, the embedding is computed into the
// memory it gives and the response has no raw_output_contents: the caller
// sends that memory as its one entry.  With several inputs the response
// carries every output's bytes in raw_output_contents.
absl::Status Infer(const EmbedService& service,
                   const inference::ModelInferRequest& request,
                   inference::ModelInferResponse* response,
                   AdmissionTicket* ticket = nullptr,
                   OutputAllocator* output = nullptr);

// Shapes include the batch dimension as -1: TIMESTEP [-1, 1], EMBEDDING
// [-1, dim] ([-1, -1] when the caller may choose dim).  The output datatype
// is the preset's default.
void FillModelMetadata(const Preset& model,
                       inference::ModelMetadataResponse* response);

// max_batch_size = limits.max_batch (clamped to int32), so dims leave the
// batch out: TIMESTEP [1], EMBEDDING [dim] or [-1].
void FillModelConfig(const Preset& model, const Limits& limits,
                     inference::ModelConfig* config);

// The model configuration's name for `dtype`: TYPE_FP32, ...
inference::DataType ConfigDataType(DType dtype);

// Name "temb", `version`, and the protocol extensions implemented here.
void FillServerMetadata(absl::string_view version,
                        inference::ServerMetadataResponse* response);

}  // namespace temb::kserve

#endif  // TEMB_KSERVE_KSERVE_CONVERT_H_
