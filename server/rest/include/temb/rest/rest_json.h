// The KServe v2 REST wire format <-> the inference.* messages the gRPC
// frontend uses, so that both protocols run the same kserve::Infer and
// answer with the same numbers and rules.  No HTTP server types here: every
// function is testable on strings.
//
// Infer bodies (POST /v2/models/{m}[/versions/{v}]/infer):
//   {"id": "...", "parameters": {...},
//    "inputs": [{"name", "shape", "datatype", "parameters"?, "data"?}],
//    "outputs": [{"name", "parameters": {"binary_data": true}}]?}
// followed, with the binary tensor data extension, by the raw bytes of each
// input whose parameters carry "binary_data_size" (the request then says
// where the JSON ends in its Inference-Header-Content-Length header).
// Responses are {"model_name", "model_version", "id"?, "outputs": [...]},
// each output with "data" (JSON) or "parameters": {"binary_data_size": N}
// and its bytes after the JSON (binary).
#ifndef TEMB_REST_REST_JSON_H_
#define TEMB_REST_REST_JSON_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "inference/grpc_service.pb.h"

namespace temb::rest {

// A message as Triton's HTTP API writes it: proto field names, every field
// present (defaults too), 64-bit integers as JSON numbers (protobuf's own
// JSON mapping would quote them, which perf_analyzer's reader rejects),
// enums by name, maps as objects.
std::string MessageToJson(const google::protobuf::Message& message);

// {"error": "<message>"}.
std::string ErrorJson(absl::string_view message);

// A parsed infer body.
struct InferBody {
  // model_name and model_version are left to the caller (they come from
  // the URL).  JSON "data" travels in the typed contents of each input, or
  // as raw_input_contents when any input is binary (JSON inputs are then
  // encoded to raw bytes too, since the protocol wants one or the other).
  inference::ModelInferRequest request;
  // The request parameter "binary_data_output": the default for outputs.
  bool binary_data_output = false;
  // Requested outputs with their "binary_data" parameter, when given.
  std::vector<std::pair<std::string, std::optional<bool>>> requested_outputs;
};

// How deeply an infer body's JSON may nest: objects and arrays, the root
// included.  A KServe body needs 4 levels plus the rank of a "data" array.
inline constexpr int kMaxJsonDepth = 32;

// Asked for the memory a parse is about to hold beyond the body itself, a
// step at a time, before it holds it; a non-OK answer stops the parse with
// that status.  (The REST frontend reserves it from the request's
// admission, so a body that parses into many times its size is bounded by
// max_queued_bytes like its bytes are.)
using ReserveParseBytes = absl::FunctionRef<absl::Status(int64_t bytes)>;

// `body` is the whole HTTP body; `json_length` the value of the
// Inference-Header-Content-Length header (nullopt: all of `body` is JSON).
// INVALID_ARGUMENT naming the field, e.g. "inputs[0].data has 3 elements,
// but shape [2, 1] needs 2", or "malformed JSON ...", or for JSON nested
// deeper than kMaxJsonDepth; whatever `reserve` answers when it refuses.
// The elements of each "data" array are kept flat while parsing (a nested
// [[x], [x], ...] costs no more than [x, x, ...]), and what the parse holds
// (document, elements, typed contents, raw copies) is asked of `reserve`
// before it is allocated, by a conservative estimate.
absl::StatusOr<InferBody> ParseInferBody(absl::string_view body,
                                         std::optional<uint64_t> json_length,
                                         ReserveParseBytes reserve);
// Without a memory budget (tests, tools).
absl::StatusOr<InferBody> ParseInferBody(absl::string_view body,
                                         std::optional<uint64_t> json_length);

// The HTTP body for `response` (of the request parsed into `body`): the
// JSON, then the bytes of each binary output, in output order.  Takes the
// raw_output_contents out of `response`.  INVALID_ARGUMENT when an output
// cannot travel as JSON (BF16: binary only).
struct EncodedInferResponse {
  std::string json;
  std::vector<std::string> binary;
  // Bytes of the whole body.
  uint64_t size() const;
};
absl::StatusOr<EncodedInferResponse> EncodeInferResponse(
    const InferBody& body, inference::ModelInferResponse* response);

// The bytes the JSON form of `response`'s non-binary outputs may take
// beyond their raw bytes (for admission: reserved before encoding).
int64_t ExtraJsonBytes(const InferBody& body,
                       const inference::ModelInferResponse& response);

}  // namespace temb::rest

#endif  // TEMB_REST_REST_JSON_H_
