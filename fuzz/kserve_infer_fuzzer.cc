// Fuzzes the KServe v2 frontend's conversion without gRPC: bytes parsed as an
// inference.ModelInferRequest -> kserve::Infer (model lookup, tensor and
// parameter decoding, the service core on the CPU backend, the response).
//
// Rejections must carry a client-error code; accepted requests must give one
// EMBEDDING output whose shape, datatype and raw bytes agree with the spec the
// request resolves to, and satisfy CheckEmbedding.
#include <cstddef>
#include <cstdint>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "embedding_checks.h"
#include "fuzz_service.h"
#include "inference/grpc_service.pb.h"
#include "proto_input.h"
#include "temb/core/embed_service.h"
#include "temb/kernels/dtype.h"
#include "temb/kserve/kserve_convert.h"

namespace temb::fuzz {
namespace {

void Run(const inference::ModelInferRequest& request) {
  const EmbedService& service = FuzzService();
  inference::ModelInferResponse response;
  const absl::Status status = kserve::Infer(service, request, &response);
  if (!status.ok()) return CheckRejection(status);

  // Infer succeeded, so each step it is made of must succeed on its own.
  absl::StatusOr<const Preset*> model = kserve::FindModel(
      service.presets(), request.model_name(), request.model_version());
  TEMB_FUZZ_CHECK(model.ok(), model.status().ToString());
  absl::StatusOr<kserve::InferCall> call =
      kserve::ParseInferRequest(request, **model);
  TEMB_FUZZ_CHECK(call.ok(), call.status().ToString());
  TEMB_FUZZ_CHECK(response.id() == request.id(),
                  "response id differs from request id");
  TEMB_FUZZ_CHECK(
      response.outputs_size() == static_cast<int>(call->inputs.size()) &&
          response.raw_output_contents_size() == response.outputs_size(),
      absl::StrCat("expected ", call->inputs.size(), " outputs, got ",
                   response.outputs_size(), " tensors and ",
                   response.raw_output_contents_size(), " raw contents"));
  for (size_t i = 0; i < call->inputs.size(); ++i) {
    const kserve::InferInput& input = call->inputs[i];
    SpecRequest part;
    part.dtype = input.dtype;
    absl::StatusOr<SpecRequest> part_request =
        PartSpecRequest(call->spec, input.part, part, service.presets());
    TEMB_FUZZ_CHECK(part_request.ok(), part_request.status().ToString());
    absl::StatusOr<EmbeddingSpec> spec =
        ResolveSpec(*part_request, service.presets(), service.limits());
    TEMB_FUZZ_CHECK(spec.ok(), spec.status().ToString());
    const auto& output = response.outputs(static_cast<int>(i));
    std::vector<int64_t> expected = input.timesteps_shape;
    if (expected.empty()) {
      expected.push_back(static_cast<int64_t>(input.timesteps.size()));
    }
    expected.push_back(spec->dim);
    TEMB_FUZZ_CHECK(output.name() == kserve::OutputNameFor(input.name),
                    "output name");
    TEMB_FUZZ_CHECK(
        std::vector<int64_t>(output.shape().begin(), output.shape().end()) ==
            expected,
        absl::StrCat("output shape [", absl::StrJoin(output.shape(), ", "),
                     "], expected [", absl::StrJoin(expected, ", "), "]"));
    absl::StatusOr<DType> datatype =
        ParseDType(absl::AsciiStrToLower(output.datatype()));
    TEMB_FUZZ_CHECK(datatype.ok() && *datatype == spec->dtype,
                    absl::StrCat("output datatype ", output.datatype(),
                                 " for dtype ", DTypeName(spec->dtype)));
    // The invariants hold for the timesteps the pipeline's model sees.
    EmbeddingSpec computed = *spec;
    std::vector<float> seen = input.timesteps;
    TEMB_FUZZ_CHECK(PipelineTimesteps(&computed, absl::MakeSpan(seen)).ok(),
                    "PipelineTimesteps failed on timesteps Infer accepted");
    CheckEmbedding(computed, seen,
                   response.raw_output_contents(static_cast<int>(i)));
  }
}

}  // namespace
}  // namespace temb::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  return temb::fuzz::SilenceProtobufLogs();
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return temb::fuzz::RunOnMessage<inference::ModelInferRequest>(
      data, size, temb::fuzz::Run);
}
