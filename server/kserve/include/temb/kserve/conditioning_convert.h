// KServe v2 <-> ConditioningService: a conditioning model (a folder of the
// model repository) as a KServe model, version "1".  Its inputs are the
// model's, by their protocol names (docs/conditioning.md):
//   timesteps           [N] or [N, 1] (Triton's batched scalar), or per
//                       token [B, L] / any rank >= 2 with a last extent
//                       other than 1: the answer then holds the distinct
//                       rows and an INT64 output "index" of that shape
//   guidance            [N], [N, 1] or one value for every row
//   pooled_projections  [N, P] or [P] (one row for every timestep)
//   a family's extras   as the model lists them
// of FP32, FP64 (rounded once to float32, as a pipeline's .float() does),
// INT64, INT32, and for row inputs also FP16 and BF16 (exact).  Its outputs
// are the model's ([N, W] or [N, L, W] in the model's dtype); a request may
// name a subset.  No request parameters besides those Triton's clients send
// and every server ignores.
#ifndef TEMB_KSERVE_CONDITIONING_CONVERT_H_
#define TEMB_KSERVE_CONDITIONING_CONVERT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "inference/grpc_service.pb.h"
#include "inference/model_config.pb.h"
#include "temb/core/admission.h"
#include "temb/core/conditioning_service.h"

namespace temb::kserve {

// A parsed request: the core's request and the float32 values it points to.
struct ConditionCall {
  std::vector<std::vector<float>> values;  // one per input
  ConditionRequest request;
};

// Checks the request's tensors against `model`'s inputs and decodes them.
// INVALID_ARGUMENT naming the field (inputs[i].datatype, .shape, .contents,
// raw_input_contents[i], outputs[o].name, parameters[...]).
absl::StatusOr<std::unique_ptr<ConditionCall>> ParseConditionRequest(
    const inference::ModelInferRequest& request,
    const ConditioningModelInfo& model);

// Parse, Serve, and the response: one output per answer tensor, bytes in
// raw_output_contents.  Codes as ConditioningService::Serve's.
absl::Status InferConditioning(const ConditioningService& service,
                               const inference::ModelInferRequest& request,
                               inference::ModelInferResponse* response,
                               AdmissionTicket* ticket);

// The model at `version` ("" or "1"): NOT_FOUND for another version, and
// for a model that is not ready FAILED_PRECONDITION (loading, or failed
// with its cause).
absl::StatusOr<ConditioningModelInfo> FindConditioningModel(
    const ConditioningService& service, absl::string_view name,
    absl::string_view version);

// Shapes with the batch dimension as -1.
void FillConditioningMetadata(const ConditioningModelInfo& model,
                              inference::ModelMetadataResponse* response);
// The ModelConfig parameter of each checkpoint tensor's weight fingerprint
// (temb/models/weight_fingerprint.h): this prefix, then the tensor's name.
inline constexpr char kWeightFingerprintKey[] = "weight_fingerprint:";
// A config parameter per input given instead of "timesteps" (the
// transformer forward's own timestep), which the metadata and the config's
// inputs leave out: "stands_for:<input>" = the value of the model's
// computation it is.
inline constexpr char kStandsForKey[] = "stands_for:";
// What each output stands for in the transformer (ConditioningOutput's
// fields of the same names in temb's own API), a parameter per output
// that has one: "replaces:<output>" = the module or parameter name,
// "replaced_kind:<output>", "blocks:<output>" = the block indices joined
// by commas (a stacked output), "input_module:<output>" (a Linear with
// one); and "folded_module:<module>" = its kind, per folded module.
inline constexpr char kReplacesKey[] = "replaces:";
inline constexpr char kReplacedKindKey[] = "replaced_kind:";
inline constexpr char kBlocksKey[] = "blocks:";
inline constexpr char kInputModuleKey[] = "input_module:";
inline constexpr char kFoldedModuleKey[] = "folded_module:";
// "embedding:<output>": the embedder's result a replaced module is handed,
// where the embedder returns several ("embedder_results" = the outputs at
// its positions joined by commas, an empty one standing for None).
inline constexpr char kEmbeddingKey[] = "embedding:";
inline constexpr char kEmbedderResultsKey[] = "embedder_results";
// Where an offload patch captures each input (ConditioningInput's fields
// in temb's own API): "module:<input>" and "argument:<input>" for a
// captured one; "instead_of:<input>" beside "stands_for:<input>".
inline constexpr char kModuleKey[] = "module:";
inline constexpr char kArgumentKey[] = "argument:";
inline constexpr char kInsteadOfKey[] = "instead_of:";
// "in_model_dtype:<input>" = "true" where the pipeline hands the input in
// the model's dtype.
inline constexpr char kInModelDTypeKey[] = "in_model_dtype:";
// The transformer class the model is computed for, and each config.json
// field its description read: "config:<field>" = its JSON text.
inline constexpr char kClassNameKey[] = "class_name";
inline constexpr char kConfigKey[] = "config:";

// A repository index entry as Triton writes it: state "READY", "LOADING"
// or "UNAVAILABLE" (failed, unloaded or not loaded, the reason says which),
// version "1".
void FillModelIndex(const ConditioningService::IndexEntry& entry,
                    inference::RepositoryIndexResponse::ModelIndex* index);

// max_batch_size: the rows one call may hold; dims leave the batch out;
// parameters: the weight fingerprints, the inputs' stands_for and what the
// outputs replace.
void FillConditioningConfig(const ConditioningModelInfo& model,
                            const Limits& limits,
                            inference::ModelConfig* config);

}  // namespace temb::kserve

#endif  // TEMB_KSERVE_CONDITIONING_CONVERT_H_
