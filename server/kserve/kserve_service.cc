#include "temb/kserve/kserve_service.h"

#include <string>
#include <utility>

#include "temb/core/version.h"
#include "temb/grpc/ordered_stream.h"
#include "temb/grpc/raw_messages.h"
#include "temb/grpc/status.h"
#include "temb/kserve/kserve_convert.h"

namespace temb::kserve {
namespace {

constexpr absl::string_view kInferMethod = "ModelInfer";
constexpr absl::string_view kStreamMethod = "ModelStreamInfer";

grpc::ServerUnaryReactor* FinishWith(grpc::CallbackServerContext* context,
                                     const absl::Status& status) {
  return FinishUnary(context, status);
}

// Timesteps answered: the rows of every output (all but its last extent).
int64_t BatchOf(const inference::ModelInferResponse& response) {
  int64_t batch = 0;
  for (const auto& output : response.outputs()) {
    int64_t rows = 1;
    for (int d = 0; d + 1 < output.shape_size(); ++d) rows *= output.shape(d);
    batch += rows;
  }
  return batch;
}

int64_t OutputBytesOf(const inference::ModelInferResponse& response) {
  int64_t bytes = 0;
  for (const std::string& raw : response.raw_output_contents()) {
    bytes += static_cast<int64_t>(raw.size());
  }
  return bytes;
}

}  // namespace

KServeService::KServeService(const EmbedService& core, const CallGate& gate,
                             RequestObserver* observer)
    : core_(core), gate_(gate), observer_(observer) {}

absl::Status KServeService::Compute(const grpc::CallbackServerContext& context,
                                    const inference::ModelInferRequest& request,
                                    inference::ModelInferResponse* response,
                                    AdmissionTicket* ticket,
                                    OutputAllocator* output) const {
  absl::StatusOr<AdmissionTicket> admitted =
      gate_.Admit(context, static_cast<int64_t>(request.ByteSizeLong()));
  if (!admitted.ok()) return admitted.status();
  *ticket = std::move(*admitted);
  return Infer(core_, request, response, ticket, output);
}

grpc::ServerUnaryReactor* KServeService::ServerLive(
    grpc::CallbackServerContext* context,
    const inference::ServerLiveRequest* /*request*/,
    inference::ServerLiveResponse* response) {
  const absl::Status status = gate_.Authenticate(*context);
  response->set_live(status.ok());
  return FinishWith(context, status);
}

grpc::ServerUnaryReactor* KServeService::ServerReady(
    grpc::CallbackServerContext* context,
    const inference::ServerReadyRequest* /*request*/,
    inference::ServerReadyResponse* response) {
  const absl::Status status = gate_.Authenticate(*context);
  response->set_ready(status.ok() && gate_.serving());
  return FinishWith(context, status);
}

grpc::ServerUnaryReactor* KServeService::ModelReady(
    grpc::CallbackServerContext* context,
    const inference::ModelReadyRequest* request,
    inference::ModelReadyResponse* response) {
  const absl::Status status = gate_.Authenticate(*context);
  response->set_ready(
      status.ok() && gate_.serving() &&
      FindModel(core_.presets(), request->name(), request->version()).ok());
  return FinishWith(context, status);
}

grpc::ServerUnaryReactor* KServeService::ServerMetadata(
    grpc::CallbackServerContext* context,
    const inference::ServerMetadataRequest* /*request*/,
    inference::ServerMetadataResponse* response) {
  const absl::Status status = gate_.Enter(*context);
  if (status.ok()) FillServerMetadata(Version(), response);
  return FinishWith(context, status);
}

grpc::ServerUnaryReactor* KServeService::ModelMetadata(
    grpc::CallbackServerContext* context,
    const inference::ModelMetadataRequest* request,
    inference::ModelMetadataResponse* response) {
  if (absl::Status status = gate_.Enter(*context); !status.ok()) {
    return FinishWith(context, status);
  }
  absl::StatusOr<const Preset*> model =
      FindModel(core_.presets(), request->name(), request->version());
  if (model.ok()) FillModelMetadata(**model, response);
  return FinishWith(context, model.status());
}

grpc::ServerUnaryReactor* KServeService::ModelConfig(
    grpc::CallbackServerContext* context,
    const inference::ModelConfigRequest* request,
    inference::ModelConfigResponse* response) {
  if (absl::Status status = gate_.Enter(*context); !status.ok()) {
    return FinishWith(context, status);
  }
  absl::StatusOr<const Preset*> model =
      FindModel(core_.presets(), request->name(), request->version());
  if (model.ok()) {
    FillModelConfig(**model, core_.limits(), response->mutable_config());
  }
  return FinishWith(context, model.status());
}

grpc::ServerUnaryReactor* KServeService::ModelInfer(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request_bytes,
    grpc::ByteBuffer* response_bytes) {
  RequestTimer timer(observer_, kInferMethod);
  AdmissionTicket ticket;
  inference::ModelInferRequest request;
  // A unary call authenticates here; a stream did once, when it opened.
  absl::Status status = gate_.Authenticate(*context);
  if (status.ok()) status = ParseRequest(*request_bytes, &request);
  inference::ModelInferResponse head;
  SliceAllocator output;
  if (status.ok()) status = Compute(*context, request, &head, &ticket, &output);
  if (status.ok()) {
    // One output was computed into `output`'s slice; several travel in the
    // response itself.
    const bool in_slice = head.raw_output_contents_size() == 0;
    const int64_t output_bytes = OutputBytesOf(head) + output.slice().size();
    if (in_slice) {
      *response_bytes = WithBytesField(
          head.SerializeAsString(),
          inference::ModelInferResponse::kRawOutputContentsFieldNumber,
          output.slice());
    } else {
      grpc::Slice whole(head.SerializeAsString());
      *response_bytes = grpc::ByteBuffer(&whole, 1);
    }
    timer.Finish(status, BatchOf(head), output_bytes, request.id());
  } else {
    timer.Finish(status, 0, 0, request.id());
  }
  return FinishUnary(context, status, std::move(ticket));
}

grpc::ServerBidiReactor<inference::ModelInferRequest,
                        inference::ModelStreamInferResponse>*
KServeService::ModelStreamInfer(grpc::CallbackServerContext* context) {
  return OrderedStreamReactor<inference::ModelInferRequest,
                              inference::ModelStreamInferResponse>::
      Start(context, gate_,
            [this](grpc::CallbackServerContext* call,
                   const inference::ModelInferRequest& request,
                   AdmissionTicket* ticket,
                   inference::ModelStreamInferResponse* response) {
              return AnswerInStream(*call, request, ticket, response);
            });
}

absl::Status KServeService::AnswerInStream(
    const grpc::CallbackServerContext& context,
    const inference::ModelInferRequest& request, AdmissionTicket* ticket,
    inference::ModelStreamInferResponse* response) const {
  inference::ModelInferResponse* answer = response->mutable_infer_response();
  RequestTimer timer(observer_, kStreamMethod);
  const absl::Status status = Compute(context, request, answer, ticket);
  if (status.ok()) {
    timer.Finish(status, BatchOf(*answer), OutputBytesOf(*answer),
                 request.id());
  } else {
    timer.Finish(status, 0, 0, request.id());
  }
  if (absl::IsUnavailable(status)) return status;
  if (!status.ok()) {
    // Only the request's identity, so that clients can match the error.
    answer->Clear();
    answer->set_model_name(request.model_name());
    answer->set_model_version(request.model_version());
    answer->set_id(request.id());
    response->set_error_message(std::string(status.message()));
  }
  return absl::OkStatus();
}

}  // namespace temb::kserve
