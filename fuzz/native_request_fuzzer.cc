// Fuzzes the native temb.v1 request path without gRPC: bytes parsed as an
// EmbedRequest -> SpecRequestFromProto -> EmbedService::Embed (preset
// resolution, validation, the CPU backend), as the Embed handler does.
//
// Rejections must carry a client-error code; accepted requests must produce
// an embedding of the resolved spec's shape that satisfies CheckEmbedding
// (no NaN, exact edge-case columns).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "embedding_checks.h"
#include "fuzz_service.h"
#include "proto_input.h"
#include "temb/core/embed_service.h"
#include "temb/v1/temb.pb.h"
#include "temb/v1_convert/conversions.h"

namespace temb::fuzz {
namespace {

// The frontend's rule: one of the two timestep fields, integers become
// float32 first.
absl::StatusOr<std::vector<float>> Timesteps(const v1::EmbedRequest& request) {
  if (request.integer_timesteps_size() == 0) {
    return std::vector<float>(request.timesteps().begin(),
                              request.timesteps().end());
  }
  if (request.timesteps_size() > 0) {
    return absl::InvalidArgumentError(
        "set either timesteps or integer_timesteps, not both");
  }
  std::vector<float> timesteps;
  for (int64_t t : request.integer_timesteps()) {
    timesteps.push_back(static_cast<float>(t));
  }
  return timesteps;
}

void Run(const v1::EmbedRequest& request) {
  absl::StatusOr<SpecRequest> spec_request =
      SpecRequestFromProto(request.preset(), request.spec(), request.dtype());
  if (!spec_request.ok()) return CheckRejection(spec_request.status());
  absl::StatusOr<std::vector<float>> timesteps = Timesteps(request);
  if (!timesteps.ok()) return CheckRejection(timesteps.status());

  const EmbedService& service = FuzzService();
  absl::StatusOr<Embedding> embedding =
      service.Embed(*spec_request, *timesteps);
  if (!embedding.ok()) return CheckRejection(embedding.status());

  // The embedding's spec must be what resolution alone gives.  Compared as
  // text: a repeat_only spec may carry a NaN in fields it never uses.
  absl::StatusOr<EmbeddingSpec> resolved =
      ResolveSpec(*spec_request, service.presets(), service.limits());
  TEMB_FUZZ_CHECK(resolved.ok() && SpecDebugString(*resolved) ==
                                       SpecDebugString(embedding->spec),
                  absl::StrCat("Embed used ", SpecDebugString(embedding->spec),
                               " but ResolveSpec gives ",
                               resolved.ok() ? SpecDebugString(*resolved)
                                             : resolved.status().ToString()));
  TEMB_FUZZ_CHECK(
      embedding->rows == static_cast<int64_t>(timesteps->size()),
      absl::StrCat("rows ", embedding->rows, " != batch ", timesteps->size()));
  // The invariants hold for the timesteps the pipeline's model sees: with
  // timestep_dtype fp16/bf16 they were rounded (and scaled) first.
  EmbeddingSpec computed = embedding->spec;
  std::vector<float> seen = *timesteps;
  TEMB_FUZZ_CHECK(PipelineTimesteps(&computed, absl::MakeSpan(seen)).ok(),
                  "PipelineTimesteps failed on timesteps Embed accepted");
  CheckEmbedding(computed, seen, embedding->data);
}

}  // namespace
}  // namespace temb::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  return temb::fuzz::SilenceProtobufLogs();
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return temb::fuzz::RunOnMessage<temb::v1::EmbedRequest>(data, size,
                                                          temb::fuzz::Run);
}
